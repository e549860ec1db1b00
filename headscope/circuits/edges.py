"""The graph a circuit lives in: senders, receivers and which sender each receiver reads.

`graph_of(target, task)` runs the task's first prompts once and finds, from what the modules did
(`headscope.circuits.residual`):
- senders, in the order they write: the embedding, then layer by layer each head of the analysed
  attention block (its output after W_O) and every other writer (an MLP or other mixer `m{L}`, a
  second one `m{L}.2`; another group's attention block `c{L}`);
- receivers: each head's query, key and value input (`a{L}.h{H}.q/.k/.v`), each other writer's
  input, and the logits (the final norm's input);
- for each receiver, the module whose input is its own copy of the residual stream (its
  pre-norm, or the receiver itself where no norm stands before it) and the senders that wrote
  that copy: every sender of earlier layers, and the same layer's writers that ran before it
  (Llama's MLP reads its layer's attention; GPT-J's parallel MLP does not), checked by summing
  them: the longest run of the layer's earlier writers whose sum the receiver reads.
Refused in one line where the stream is not such a sum (`decompose`). Where a norm stands between
the analysed attention block and the residual stream (Gemma 2 and 3's post-attention norm), a
head sends its share of what reaches the stream with the norm's per-row scale frozen at the
run's own value, g * P(result_h) / s (the rule direct logit attribution follows,
`headscope.circuits.dla`): the shares add up to the norm's output, so a head's share is its own
again (`headscope.circuits.stream_copies` records them; `graph.head_post` holds the norm).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import HeadscopeError
from .residual import decompose, is_norm, layer_list, mismatch, norm_form, record

__all__ = ["Graph", "Receiver", "graph_of"]


@dataclass
class Receiver:
    """One receiving module: `names` (one per receiver it holds: a head block's 3 x H, else one),
    the `module` whose input is replaced, the `norm` between the residual and it (None: none),
    and `upstream`, the indices of the senders whose outputs its input sums."""

    layer: int
    kind: str  # "heads", "module", "logits"
    names: list
    module: object
    norm: object
    upstream: list


@dataclass
class Graph:
    """Senders `[(name, kind, layer, head)]`, receivers, and the model's structure they come from."""

    senders: list
    receivers: list
    parts: object  # the Decomposition
    n_heads: int
    head_sender: dict = field(default_factory=dict)  # (layer, head) -> sender index
    head_post: dict = field(default_factory=dict)  # layer -> (post-attention norm, its NormForm)
    writer_sender: dict = field(default_factory=dict)  # writer path -> sender index

    def edges(self) -> list:
        """Every edge `(sender index, receiver, receiver name)` in a fixed order."""
        return [(u, receiver, name) for receiver in self.receivers for name in receiver.names for u in receiver.upstream]

    def nodes(self):
        """DataFrame (name, kind, layer, head) of every node, senders then receivers' own names."""
        import pandas as pd

        rows = [dict(name=name, kind=kind, layer=layer, head=head) for name, kind, layer, head in self.senders]
        rows.append(dict(name="logits", kind="logits", layer=None, head=None))
        table = pd.DataFrame(rows, columns=["name", "kind", "layer", "head"])
        table["layer"] = table["layer"].astype("Int64")
        table["head"] = table["head"].astype("Int64")
        return table


def _module_name(layer: int, kind: str, seen: dict) -> str:
    base = f"c{layer}" if kind == "attn" else f"m{layer}"
    seen[base] = seen.get(base, 0) + 1
    return base if seen[base] == 1 else f"{base}.{seen[base]}"


@torch.no_grad()
def graph_of(target, task) -> Graph:
    """The graph of `target`'s model (module docstring), found on the task's first prompts."""
    model, selection = target.model, target.selection
    rows = task.subset(slice(0, min(4, task.n)))
    inputs, positions = target.inputs(rows, "clean")
    length = inputs["decoder_input_ids" if target.two_inputs else "input_ids"].shape[1]
    stack = layer_list(model, selection)[0].rpartition(".")[0]
    with record(model, positions, length, target.d_model, within=stack + "." if stack else "") as rec:
        model(**inputs, use_cache=False)
    parts = decompose(model, rec, selection, target.d_model)
    modules = dict(model.named_modules())
    senders = [("embed", "embed", None, None)]
    graph = Graph(senders, [], parts, selection.n_heads)
    layers = dict(parts.layers)
    for layer, writers in parts.writers.items():
        start = rec.inputs[layers[layer]]
        ran = []  # (writer, its sender indices) of this layer so far
        seen: dict = {}
        for writer in writers:
            if writer.kind == "heads" and writer.post_norm is not None:  # Gemma 2/3: shares at a frozen scale
                weight = next(writer.module.parameters())
                graph.head_post[layer] = (writer.post_norm, norm_form(writer.post_norm, target.d_model,
                                                                      torch.float32, weight.device))
            norm, reads, reader = _reader(writer, rec, modules, layers[layer], target.d_model)
            upstream = _upstream(graph, layer, writer, start, reads, ran, rec)
            if writer.kind == "heads":
                names = [f"a{layer}.h{h}.{part}" for h in range(graph.n_heads) for part in "qkv"]
                graph.receivers.append(Receiver(layer, "heads", names, writer.module, norm, upstream))
                first = len(senders)
                senders.extend((f"a{layer}.h{h}", "head", layer, h) for h in range(graph.n_heads))
                graph.head_sender.update({(layer, h): first + h for h in range(graph.n_heads)})
                ran.append((writer, list(range(first, first + graph.n_heads))))
            else:
                name = _module_name(layer, writer.kind, seen)
                graph.receivers.append(Receiver(layer, "module", [name], reader, norm, upstream))
                graph.writer_sender[writer.path] = len(senders)
                senders.append((name, writer.kind, layer, None))
                ran.append((writer, [len(senders) - 1]))
    final = modules[parts.final_norm] if parts.final_norm else modules[parts.unembed]
    graph.receivers.append(Receiver(None, "logits", ["logits"], final, None, list(range(len(senders)))))
    return graph


def _reader(writer, rec, modules, layer_path: str, d_model: int):
    """`(norm, residual copy, module)`: the norm whose output the writer reads (None: it reads the
    stream itself), the residual state that norm (or the writer) reads, and the module whose input
    is replaced (the writer, or the first linear of an MLP written inline in its layer's forward)."""
    module, given = writer.module, rec.inputs.get(writer.path)
    if given is None:
        module, given = _inline_entry(writer, rec, modules, layer_path, d_model)
    for path, candidate in modules.items():
        if path.startswith(layer_path + ".") and is_norm(candidate, d_model) and path in rec.outputs \
                and torch.equal(rec.outputs[path], given):
            return candidate, rec.inputs[path], module
    return None, given, module


def _inline_entry(writer, rec, modules, layer_path: str, d_model: int):
    """An MLP written inline (OPT's, BioGPT's, mBART's fc1 -> activation -> fc2): the writer (fc2)
    reads the activation, not the stream; the module that reads the last norm before it is the
    MLP's entry. HeadscopeError where there is none."""
    done = rec.order[:rec.order.index(writer.path)] if writer.path in rec.order else []
    norms = [p for p in done if p.startswith(layer_path + ".") and is_norm(modules[p], d_model)]
    if norms:  # the entry's own output is not the stream's width, so it is known by its input alone
        entry = next((p for p in rec.inputs if p.startswith(layer_path + ".") and p not in rec.outputs
                      and torch.equal(rec.inputs[p], rec.outputs[norms[-1]])), None)
        if entry is not None:
            return modules[entry], rec.inputs[entry]
    raise HeadscopeError(f"{writer.path} was not seen reading the residual stream")


def _upstream(graph: Graph, layer: int, writer, start, reads, ran: list, rec) -> list:
    """Sender indices summed in `reads`: all earlier layers' and the first of this layer's writers
    that ran before it, as many as the sum needs (all of them; none: a parallel block; some:
    GraniteMoeShared's shared MLP reads what its MoE reads, not what the MoE wrote)."""
    earlier = list(range(len(graph.senders) - sum(len(s) for _, s in ran)))
    found, best = None, None  # the closest run within the tolerance (bfloat16's is loose), then the longest
    for count in range(len(ran), -1, -1):
        contributions = [rec.outputs[w.post_path or w.path] for w, _ in ran[:count]]
        error = mismatch(reads, start + sum(contributions), reads, *contributions)
        if error is not None and (best is None or error < best):
            found, best = count, error
    if found is not None:
        return earlier + [i for _, indices in ran[:found] for i in indices]
    raise HeadscopeError(f"layer {layer}'s {writer.path} reads a residual state that is neither its layer's input nor "
                         f"that input plus what ran before it in the layer, so its inputs cannot be split into edges")
