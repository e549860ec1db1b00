"""Small models and tasks for the circuit tests: `random_task(seed)` (clean prompts of random tokens,
corrupted after position 2, random answers), `scaled(model, std, seed)` (every matrix drawn
again at a scale where heads attend sharply enough for edges to matter) and
`one_edge_nudged(model, task, src, dst, t)` (the metric with one edge moved part of the way)."""
import torch

from headscope.circuits.edges import graph_of
from headscope.circuits.target import Target
from headscope.circuits.stream_copies import split_run
from headscope.circuits.tasks import Task

from tests.support.tiny import VOCAB, tiny_config, tiny_model

__all__ = ["N", "LENGTH", "random_task", "scaled", "one_edge_nudged", "scaled_family", "BLOCK_FAMILIES"]

# Block shapes the circuit code must read alike: GQA with q/k/v biases (Qwen2), a GQA Llama, Gemma
# 2's post-norms, parallel attention and MLP on one norm (Phi, GPT-J), OPT's flat MLP rows,
# multi-head latent attention (DeepSeek-V3), an MoE (Mixtral), an encoder-decoder's decoder (T5).
BLOCK_FAMILIES = ["qwen2", "llama", "gemma2", "phi", "gptj", "opt", "deepseek_v3", "mixtral", "t5"]

N, LENGTH = 5, 8


def random_task(seed: int = 0, n: int = N, length: int = LENGTH) -> Task:
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(3, VOCAB, (n, length), generator=gen)
    corrupted = clean.clone()
    corrupted[:, 2:] = torch.randint(3, VOCAB, (n, length - 2), generator=gen)
    answer = torch.randint(3, 50, (n,), generator=gen)
    return Task(clean=clean, corrupted=corrupted, answer=answer, wrong=answer + 40)


def scaled(model, std: float, seed: int = 3):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    return model


def one_edge_nudged(model, task, src: str, dst: str, t: float) -> float:
    """sum_b M_b when the edge src -> dst alone carries clean + t (corrupted - clean)."""
    target = Target(model, task)
    graph = graph_of(target, task)
    names = [s[0] for s in graph.senders]
    clean_inputs, _ = target.inputs(task, "clean")  # an encoder-decoder's decoder inputs too
    corrupted_inputs, _ = target.inputs(task, "corrupted")
    with torch.no_grad(), split_run(target, graph) as run:
        model(**corrupted_inputs, use_cache=False)
    corrupted = {i: v.clone() for i, v in run.senders.items()}
    with torch.no_grad(), split_run(target, graph) as run:
        model(**clean_inputs, use_cache=False)
    clean = {i: v.clone() for i, v in run.senders.items()}
    u = names.index(src)

    def delta_for(receiver):
        if dst not in receiver.names:
            return None
        delta = torch.zeros(len(receiver.names), *clean[0].shape)
        delta[receiver.names.index(dst)] = t * (corrupted[u] - clean[u])
        return delta

    with torch.no_grad(), split_run(target, graph, delta_for):
        logits = model(**clean_inputs, use_cache=False).logits
    return float(task.score(target.aligned(logits)).double().sum())


def scaled_family(family: str):
    """The family's tiny interface model (T5: its encoder-decoder) at weights scaled to 0.2."""
    import transformers as tf

    if family == "t5":
        model = tiny_model(family, kind="encoder_decoder")
    else:
        torch.manual_seed(0)
        model = tf.AutoModelForCausalLM.from_config(tiny_config(family, "interface")).eval()
    return scaled(model, 0.2)
