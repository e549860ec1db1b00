"""attribute: exact is headscope.patch; AtP is the true first derivative; the QK fix is exact where
everything after the pattern is linear; AtP* ranks by GradDrop's magnitude."""
import types

import pytest
import torch

import headscope
from headscope.circuits.attribution import attribute
from headscope.circuits.tasks import Task
from headscope.hf.hooks import model_hooks

from tests.support.tiny import VOCAB, tiny_model

N, LENGTH = 6, 9


def _task(seed: int = 0, metric: str = "logit_diff") -> Task:
    """Random prompts whose corrupted copies differ from the third token on."""
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(3, VOCAB, (N, LENGTH), generator=gen)
    corrupted = clean.clone()
    corrupted[:, 3:] = torch.randint(3, VOCAB, (N, LENGTH - 3), generator=gen)
    mask = torch.ones(N, LENGTH, dtype=torch.long)
    mask[2, -2:] = 0
    return Task(clean=clean, corrupted=corrupted, attention_mask=mask, metric=metric,
                answer=torch.randint(3, VOCAB, (N,), generator=gen), wrong=torch.randint(3, VOCAB, (N,), generator=gen))


def _scaled(model, std: float):
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    return model


@pytest.fixture(scope="module")
def llama():
    return _scaled(tiny_model("llama"), 0.2)  # 6 query heads sharing 2 key/value heads


@pytest.mark.parametrize("point", ["z", "k", "pattern"])
@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_exact_is_patch(llama, point, direction):
    task = _task()
    table = attribute(llama, task, method="exact", point=point, direction=direction)
    loaded = types.SimpleNamespace(model=llama, tokenizer=None)
    reference = headscope.patch(loaded, task.inputs("clean"), task.inputs("corrupted"), task.score, hook=point,
                                direction=direction)
    assert list(zip(table["layer"], table["head"])) == list(zip(reference["layer"], reference["head"]))
    torch.testing.assert_close(torch.tensor(table.effect.values), torch.tensor(reference.effect.values),
                               atol=1e-6, rtol=0)
    assert table.attrs["clean_metric"] == pytest.approx(reference.attrs["clean_metric"], abs=1e-6)
    assert len(table) == 2 * (2 if point == "k" else 6)  # k: one row per key/value head
    assert table.attrs["passes"] == {"forward": 2 + len(table), "backward": 0}


def _finite_difference(model, task: Task, layer: int, head: int, point: str, eps: float = 1e-2) -> float:
    """d/dt of sum_b M_b(corrupted run with the head's activation a + t (a_clean - a)) at t = 0, by
    central differences: the quantity AtP computes with one backward pass."""
    axis = 2 if point == "z" else 1
    name = f"layers.{layer}.attn.hook_{point}"
    seen = {}
    with torch.no_grad(), model_hooks(model, {name: lambda v, h: seen.__setitem__("clean", v.clone())}):
        reference = model(**task.inputs("clean")).logits  # the kl metric's clean distribution

    def run(t: float) -> float:
        def nudge(value, hook):
            index = (slice(None),) * axis + (head,)
            value = value.clone()
            value[index] = value[index] + t * (seen["clean"][index] - value[index])
            return value
        with torch.no_grad(), model_hooks(model, {name: nudge}):
            return float(task.score(model(**task.inputs("corrupted")).logits, reference=reference).double().sum())

    return (run(eps) - run(-eps)) / (2 * eps)


@pytest.mark.parametrize("point,metric", [("z", "logit_diff"), ("q", "logit_diff"), ("v", "logit_diff"),
                                          ("z", "prob"), ("z", "kl")])
def test_atp_is_the_first_derivative(llama, point, metric):
    task = _task(seed=1, metric=metric)
    table = attribute(llama, task, method="atp", point=point, batch_size=4)
    assert table.attrs["passes"] == {"forward": 2, "backward": 1.0}
    assert table.attrs["metric"] == metric
    gap = (table.attrs["clean_metric"] - table.attrs["corrupted_metric"]) * task.n
    derivatives = torch.tensor([_finite_difference(llama, task, row.layer, row.head, point)
                                for row in table.itertuples()], dtype=torch.float64)
    numerators = torch.tensor(table.effect.values, dtype=torch.float64) * gap  # back to the metric's units
    assert float(derivatives.abs().max()) > 0  # not trivially zero
    torch.testing.assert_close(numerators, derivatives, atol=1e-3 * float(derivatives.abs().max()), rtol=0)


def _attention_only(seed: int = 0):
    """One layer of attention, no MLP (zeroed) and no final norm: the logits are linear in the
    pattern, so the QK fix is exact for a query or key patch."""
    model = _scaled(tiny_model("llama", seed=seed), 0.2)
    model.model.layers = model.model.layers[:1]
    model.config.num_hidden_layers = 1
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.zero_()
        attention = model.model.layers[0].self_attn
        attention.q_proj.weight.mul_(6.0)  # saturated attention: where plain AtP goes wrong
    model.model.norm = torch.nn.Identity()
    return model


@pytest.mark.parametrize("point", ["q", "k"])
def test_qk_fix_is_exact_where_the_rest_is_linear(point):
    model = _attention_only()
    task = _task(seed=2)
    exact = attribute(model, task, method="exact", point=point)
    fixed = attribute(model, task, method="atp*", point=point)
    plain = attribute(model, task, method="atp", point=point)
    torch.testing.assert_close(torch.tensor(fixed.effect.values), torch.tensor(exact.effect.values), atol=1e-4,
                               rtol=1e-4)
    # One layer: nothing to cancel, the magnitude is |effect|.
    torch.testing.assert_close(torch.tensor(fixed.magnitude.values), torch.tensor(fixed.effect.abs().values))
    # Saturated attention: the linear estimate misses by far more than the fix does.
    assert (plain.effect - exact.effect).abs().max() > 100 * (fixed.effect - exact.effect).abs().max()


def test_graddrop_terms(llama):
    """AtP* on a 2-layer model: a layer-1 head's GradDrop magnitude is |AtP| (only the drop of layer 0,
    which leaves its gradient alone, counts); a layer-0 head's is its direct-path |AtP| with layer 1's
    update dropped."""
    task = _task(seed=3)
    star = attribute(llama, task, method="atp*", point="z", batch_size=3)
    plain = attribute(llama, task, method="atp", point="z", batch_size=3)
    assert star.attrs["passes"] == {"forward": 2, "backward": 3.0}  # 1 + L (L = 2)
    late = star[star.layer == 1]
    torch.testing.assert_close(torch.tensor(late.magnitude.values), torch.tensor(late.effect.abs().values),
                               atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(torch.tensor(star.effect.values), torch.tensor(plain.effect.values), atol=1e-6,
                               rtol=1e-5)
    early = star[star.layer == 0]
    assert not torch.allclose(torch.tensor(early.magnitude.values), torch.tensor(early.effect.abs().values))


def test_gradients_accumulate_over_batches(llama):
    task = _task(seed=4)
    whole = attribute(llama, task, method="atp", point="z", batch_size=N)
    pieces = attribute(llama, task, method="atp", point="z", batch_size=2)
    torch.testing.assert_close(torch.tensor(whole.effect.values), torch.tensor(pieces.effect.values), atol=1e-5,
                               rtol=1e-5)


def test_bad_input_is_one_line(llama):
    task = _task()
    for kwargs, match in ((dict(method="eap"), "unknown method"), (dict(point="scores"), "cannot attribute"),
                          (dict(direction="sideways"), "unknown direction"), (dict(batch_size=0), "batch_size")):
        with pytest.raises(headscope.HeadscopeError, match=match) as err:
            attribute(llama, task, **kwargs)
        assert "\n" not in str(err.value)
    same = Task(clean=task.clean, corrupted=task.clean, answer=task.answer, wrong=task.wrong)
    with pytest.raises(headscope.HeadscopeError, match="no gap"):
        attribute(llama, same, method="atp")
    with pytest.raises(headscope.HeadscopeError, match="another tokenizer"):
        _other_tokenizer(llama, task)


def _other_tokenizer(model, task):
    """A task whose fingerprint names another tokenizer than the model's."""
    from tests.support.planted import char_tokenizer
    from headscope.circuits.tasks import tokenizer_fingerprint

    loaded = types.SimpleNamespace(model=model, tokenizer=char_tokenizer())
    stranger = Task(clean=task.clean, corrupted=task.corrupted, answer=task.answer, wrong=task.wrong,
                    tokenizer="0" * len(tokenizer_fingerprint(char_tokenizer())))
    attribute(loaded, stranger, method="atp")
