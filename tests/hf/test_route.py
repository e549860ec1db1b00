"""Routing state is per model (`headscope.hf.route`): two models routed at once keep their own
sessions and previous implementation, contexts may exit in any order, the state goes with the
model when it is garbage-collected, and every exit path restores the model."""
import gc
import weakref

import pytest
import torch

from headscope.hf import route
from tests.support.tiny import tiny_inputs, tiny_model


class Recorder(route.Session):
    """Watches every layer of one model and records the layers whose pattern it received."""

    def __init__(self, model):
        self.layer_of = route.layer_map(model)
        self.seen = []

    def wants_pattern(self, layer):
        return True

    def on_pattern(self, layer, pattern, attention_mask, heads=None):
        self.seen.append(layer)


@pytest.fixture
def two_models():
    first, second = tiny_model("gpt2", seed=0), tiny_model("gpt2", seed=1)
    second.set_attn_implementation("eager")  # a different implementation to come back to
    return first, second


@torch.no_grad()
def test_two_models_routed_at_once_keep_their_own_state(two_models):
    first, second = two_models
    x = tiny_inputs()
    a, b = Recorder(first), Recorder(second)
    with route.routed(first, a):
        with route.routed(second, b):
            assert set(map(id, route.routed_models())) == {id(first), id(second)}
            assert route.sessions_on(first) == [a] and route.sessions_on(second) == [b]
            first(**x)
            assert a.seen == [0, 1] and b.seen == []
            second(**x)
            assert a.seen == [0, 1] and b.seen == [0, 1]
        assert second.config._attn_implementation == "eager"
        assert first.config._attn_implementation == route.IMPLEMENTATION
        assert route.routed_models() == [first] and route.sessions_on(second) == []
    assert first.config._attn_implementation == "sdpa"
    assert not route.routed_models()


@torch.no_grad()
def test_contexts_on_two_models_may_exit_out_of_order(two_models):
    first, second = two_models
    a, b, a_again = Recorder(first), Recorder(second), Recorder(first)
    outer_first, outer_second, inner_first = route.routed(first, a), route.routed(second, b), route.routed(first, a_again)
    outer_first.__enter__()
    outer_second.__enter__()
    inner_first.__enter__()
    assert route.sessions_on(first) == [a, a_again]
    outer_first.__exit__(None, None, None)  # the first model's outer context leaves before the second's
    assert route.sessions_on(first) == [a_again] and first.config._attn_implementation == route.IMPLEMENTATION
    inner_first.__exit__(None, None, None)
    assert first.config._attn_implementation == "sdpa" and route.sessions_on(second) == [b]
    outer_second.__exit__(None, None, None)
    assert second.config._attn_implementation == "eager" and not route.routed_models()


def test_an_exception_in_nested_contexts_restores_both_models(two_models):
    first, second = two_models
    with pytest.raises(RuntimeError, match="inside"):
        with route.routed(first, Recorder(first)):
            with route.routed(second, Recorder(second)):
                raise RuntimeError("inside")
    assert first.config._attn_implementation == "sdpa" and second.config._attn_implementation == "eager"
    assert not route.routed_models()


def test_routing_does_not_keep_a_model_alive():
    model = tiny_model("llama", seed=2)
    gone = weakref.ref(model)
    with route.routed(model, Recorder(model)):
        assert route.routed_models() == [model]
    del model
    gc.collect()
    assert gone() is None and not route.routed_models()


def test_state_goes_with_a_model_collected_while_routed():
    """A context entered and abandoned (never exited) must not leave its model's state behind
    for a later model to find."""
    model = tiny_model("gpt2", seed=3)
    gone = weakref.ref(model)
    context = route.routed(model, Recorder(model))
    context.__enter__()
    assert len(route.routed_models()) == 1
    del model, context
    gc.collect()
    assert gone() is None and not route.routed_models()
    fresh = tiny_model("gpt2", seed=3)
    assert route.sessions_on(fresh) == [] and fresh.config._attn_implementation == "sdpa"
