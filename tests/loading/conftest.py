import pytest


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A load cache of this test's own (`HEADSCOPE_CACHE` at tmp_path / "cache", not yet made),
    apart from the session's."""
    root = tmp_path / "cache"
    monkeypatch.setenv("HEADSCOPE_CACHE", str(root))
    return root


@pytest.fixture(scope="package")
def smollm2_by_transformers():
    """`(model, tokenizer)`: the bundled SmolLM2 GGUF file as transformers itself loads it
    (`from_pretrained(..., gguf_file=)`), the reference headscope's conversion must equal; loaded
    once for the loading tests (it decodes the file's metadata four times: about 10 s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from headscope.loading.loader import ALIASES

    path = ALIASES["smollm2-135m"].location()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True).eval()
    return model, AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
