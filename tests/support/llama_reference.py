"""A Llama forward written out from the weights, in which every receiver of a circuit's graph reads
its own copy of the residual stream: the independent reference for EAP, EAP-IG and exact edge
patching (`headscope.circuits` finds the same numbers through the model's own modules and hooks).

- `LlamaReference(model)`: `senders(ids)` -> {name: [batch, pos, d_model]} (embed, a{L}.h{H}: a
  head's output after its slice of W_O, m{L}); `logits(ids, deltas=None, embed=None)` with
  `deltas` {receiver name: [batch, pos, d_model]} added to that receiver's copy only (receivers
  a{L}.h{H}.q/.k/.v, m{L}, logits) and `embed` replacing the embedding's output.
- `eap_ig_scores(ref, task, steps, riemann)`: {(src, dst): score} by integrated gradients taken
  with autograd on this forward, at the points the EAP-IG code uses (left: k = 0..S-1 over S) or
  ending at the clean run (right: k = 1..S).
- `edge_patched_metric(ref, task, src, dst)`: the mean metric with the one edge src -> dst carrying
  the corrupted run's value (exact edge patching).

Only what a plain Llama decoder does: RMSNorm, rotary positions, grouped-query attention with a
causal mask (no padding), a gated SiLU MLP; `forward` checks itself against the model's logits.
"""
import torch

__all__ = ["LlamaReference", "eap_ig_scores", "edge_patched_metric"]


def _rms(norm, x):
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return norm.weight * (x.float() * torch.rsqrt(variance + norm.variance_epsilon)).to(x.dtype)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaReference:
    def __init__(self, model):
        self.model = model
        config = model.config
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.n_heads
        self.layers = list(model.model.layers)

    def receivers(self):
        names = []
        for layer in range(len(self.layers)):
            names += [f"a{layer}.h{h}.{p}" for h in range(self.n_heads) for p in "qkv"] + [f"m{layer}"]
        return names + ["logits"]

    def _run(self, ids, deltas=None, embed=None, keep=None):
        deltas = deltas or {}
        x = self.model.model.embed_tokens(ids)
        if embed is not None:
            x = embed(x)
        if keep is not None:
            keep["embed"] = x
        batch, length = ids.shape
        positions = torch.arange(length)[None].expand(batch, -1)
        cos, sin = self.model.model.rotary_emb(x, positions)  # (B, T, head_dim)
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        group = self.n_heads // self.n_kv
        d = self.head_dim
        for layer, block in enumerate(self.layers):
            attn = block.self_attn
            results = []
            for h in range(self.n_heads):
                def read(part, h=h):
                    return _rms(block.input_layernorm, x + deltas.get(f"a{layer}.h{h}.{part}", 0))
                kv = h // group
                q = attn.q_proj(read("q"))[..., h * d:(h + 1) * d]  # (B, T, d)
                k = attn.k_proj(read("k"))[..., kv * d:(kv + 1) * d]
                v = attn.v_proj(read("v"))[..., kv * d:(kv + 1) * d]
                q = q * cos + _rotate_half(q) * sin
                k = k * cos + _rotate_half(k) * sin
                scores = (q @ k.transpose(-1, -2)) * attn.scaling  # (B, T, T)
                pattern = torch.softmax(scores.masked_fill(~causal, float("-inf")).float(), -1).to(q.dtype)
                z = pattern @ v  # (B, T, d)
                results.append(z @ attn.o_proj.weight[:, h * d:(h + 1) * d].T)  # (B, T, D)
                if keep is not None:
                    keep[f"a{layer}.h{h}"] = results[-1]
            x = x + sum(results)
            mlp_out = block.mlp(_rms(block.post_attention_layernorm, x + deltas.get(f"m{layer}", 0)))
            if keep is not None:
                keep[f"m{layer}"] = mlp_out
            x = x + mlp_out
        return self.model.lm_head(_rms(self.model.model.norm, x + deltas.get("logits", 0)))

    def logits(self, ids, deltas=None, embed=None):
        return self._run(ids, deltas, embed)

    def senders(self, ids):
        kept = {}
        with torch.no_grad():
            self._run(ids, keep=kept)
        return kept

    def check(self, ids, atol=1e-5):
        """This forward's logits equal the model's own."""
        with torch.no_grad():
            ours, theirs = self.logits(ids), self.model(input_ids=ids).logits
        torch.testing.assert_close(ours, theirs, atol=atol, rtol=1e-4)


def _upstream(sender: str, receiver: str) -> bool:
    """Whether `sender` wrote before `receiver` reads (the graph's edges)."""
    if sender == "embed":
        return True
    if receiver == "logits":
        return True
    s_layer = int(sender[1:].split(".")[0])
    r_layer = int(receiver[1:].split(".")[0])
    if receiver.startswith("m"):  # an MLP reads its own layer's heads
        return s_layer < r_layer or (s_layer == r_layer and sender.startswith("a"))
    return s_layer < r_layer


def eap_ig_scores(ref: LlamaReference, task, steps: int, riemann: str = "left") -> dict:
    """{(src, dst): score}: (1 / n) sum_b (a_src^corrupted - a_src^clean) . g_dst, g averaged over
    the interpolation points (module docstring)."""
    clean_ids, corrupted_ids = task.clean, task.corrupted
    clean, corrupted = ref.senders(clean_ids), ref.senders(corrupted_ids)
    e_clean, e_corrupted = clean["embed"], corrupted["embed"]
    first = 0 if riemann == "left" else 1
    grads = {r: 0.0 for r in ref.receivers()}
    for k in range(first, first + steps):
        alpha = k / steps
        leaves = {r: torch.zeros_like(e_clean, requires_grad=True) for r in ref.receivers()}
        metric = task.score(ref.logits(clean_ids, leaves, embed=lambda e: e_corrupted + alpha * (e_clean - e_corrupted)))
        found = torch.autograd.grad(metric.sum(), list(leaves.values()))
        for r, g in zip(leaves, found):
            grads[r] = grads[r] + g / steps
    scores = {}
    for r in ref.receivers():
        for u in clean:
            if _upstream(u, r):
                scores[(u, r)] = float(((corrupted[u] - clean[u]) * grads[r]).sum()) / task.n
    return scores


def edge_patched_metric(ref: LlamaReference, task, src: str, dst: str) -> float:
    """The mean metric with only src -> dst carrying the corrupted run's value of src."""
    clean, corrupted = ref.senders(task.clean), ref.senders(task.corrupted)
    with torch.no_grad():
        logits = ref.logits(task.clean, {dst: corrupted[src] - clean[src]})
    return float(task.score(logits).double().mean())
