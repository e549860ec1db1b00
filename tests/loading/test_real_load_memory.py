"""Loading the bundled SmolLM2 holds one copy of its weights (slow): a GGUF conversion's tensors are
the model's parameters, a load cache entry's parameters are pages of its file, and what the model
computes (buffers that are not in the state dict, such as rotary `inv_freq`, and the logits)
equals transformers' own GGUF loading exactly."""
import sys
from pathlib import Path

import pytest
import torch

import headscope
from headscope.loading import gguf_file

pytestmark = pytest.mark.slow

TEXT = ["The cat sat on the mat because it was warm.", "Numbers like 42 and 7 appear here."]


@pytest.fixture(scope="module")
def fresh():
    """`(loaded, decoded)`: a conversion of the bundled file that skips the load cache, and the
    state dicts its decoding returned."""
    decoded = []
    original = gguf_file.gguf_state_dict

    def keep(*args, **kwargs):
        decoded.append(original(*args, **kwargs))
        return decoded[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf_file, "gguf_state_dict", keep)
        loaded = headscope.load("smollm2-135m", device="cpu", cache=False)
    return loaded, decoded


def _storages(model) -> set[int]:
    return {p.untyped_storage().data_ptr() for p in model.parameters()}


def test_a_conversion_keeps_the_decoded_tensors_as_the_parameters(fresh):
    loaded, decoded = fresh
    (state_dict,) = decoded
    assert _storages(loaded.model) <= {t.untyped_storage().data_ptr() for t in state_dict.values()}
    assert len(state_dict) == len(list(loaded.model.parameters())) == 272  # lm_head is tied: one tensor


def _mapped_ranges(path: Path) -> list[tuple[int, int]]:
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(str(path)):
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            ranges.append((start, end))
    return ranges


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_a_cache_entry_is_read_without_a_copy(smollm2):
    loaded = headscope.load("smollm2-135m", device="cpu")  # the session's entry exists: read from it
    weights = Path(loaded.model.name_or_path) / "model.safetensors"
    ranges = _mapped_ranges(weights.resolve())
    assert ranges, f"{weights} is not mapped"
    for name, parameter in loaded.model.named_parameters():
        pointer = parameter.data_ptr()
        assert any(start <= pointer < end for start, end in ranges), name


@torch.no_grad()
def test_buffers_and_logits_equal_transformers_own_gguf_loading(fresh, smollm2_by_transformers, smollm2):
    theirs = smollm2_by_transformers[0]
    tokenizer = smollm2.tokenizer
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    batch = tokenizer(TEXT, return_tensors="pt", padding=True)
    reference_buffers = dict(theirs.named_buffers())
    assert any("inv_freq" in name for name in reference_buffers)
    reference = theirs(**batch).logits
    for loaded in (fresh[0], smollm2):
        buffers = dict(loaded.model.named_buffers())
        assert buffers.keys() == reference_buffers.keys()
        for name, buffer in reference_buffers.items():
            assert buffers[name].device.type == "cpu" and torch.equal(buffers[name], buffer), name
        assert torch.equal(loaded.model(**batch).logits, reference)
