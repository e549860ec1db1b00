import pytest


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A load cache of this test's own (`HEADSCOPE_CACHE` at tmp_path / "cache", not yet made),
    apart from the session's."""
    root = tmp_path / "cache"
    monkeypatch.setenv("HEADSCOPE_CACHE", str(root))
    return root
