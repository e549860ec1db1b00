import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session", autouse=True)
def load_cache(tmp_path_factory):
    """The load cache of this test session: never the user's; built by the first GGUF load and
    read by every later one, subprocesses (CLI, notebooks) included."""
    previous = os.environ.get("HEADSCOPE_CACHE")
    os.environ["HEADSCOPE_CACHE"] = str(tmp_path_factory.mktemp("headscope-cache"))
    yield Path(os.environ["HEADSCOPE_CACHE"])
    if previous is None:
        del os.environ["HEADSCOPE_CACHE"]
    else:
        os.environ["HEADSCOPE_CACHE"] = previous


@pytest.fixture(scope="session")
def smollm2(load_cache):
    import headscope

    return headscope.load("smollm2-135m", device="cpu")


@pytest.fixture(scope="session")
def minilm():
    import headscope

    return headscope.load("minilm-l6", device="cpu")
