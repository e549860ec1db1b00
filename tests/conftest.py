import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def smollm2():
    import headscope

    return headscope.load("smollm2-135m", device="cpu")


@pytest.fixture(scope="session")
def minilm():
    import headscope

    return headscope.load("minilm-l6", device="cpu")
