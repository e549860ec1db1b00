"""Session fixtures shared by every test folder: the load cache, the two bundled models, and the
planted models of `tests/support/` (each saved once by its factory, `save_planted` and
`save_planted_positions`, and loaded once: `planted`, `planted_positions`), the trained
phase-change model (`phase_change`, slow tests only), and `headscope analyze` of each bundled
model with its defaults, run once (`golden_analyses`, slow tests only), and Chromium for the
browser tests (`browser`, one per module)."""
import os
from pathlib import Path

import pytest


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
def golden_analyses(tmp_path_factory):
    """`get(model) -> (output folder, the finished process)`: `headscope analyze MODEL` with every
    option at its default, in its own process (`tests/support/golden/regenerate.py`'s command),
    run at most once per model and session: the golden tables and the end-to-end CLI test read
    the same run."""
    from tests.support.golden.regenerate import run_analyze

    done = {}

    def get(model: str):
        if model not in done:
            out = tmp_path_factory.mktemp("golden") / model
            done[model] = (out, run_analyze(model, out))
        return done[model]
    return get


@pytest.fixture(scope="session")
def minilm():
    import headscope

    return headscope.load("minilm-l6", device="cpu")


@pytest.fixture(scope="session")
def planted_dir(tmp_path_factory) -> Path:
    """The planted model of `tests/support/planted.py` saved once as a model folder, for what loads it
    by path (the command line, subprocesses, a test that needs its own copy to edit)."""
    from tests.support.planted import save_planted

    return save_planted(tmp_path_factory.mktemp("planted"))


@pytest.fixture(scope="session")
def planted_path(planted_dir) -> str:
    """`planted_dir` as the string a command line takes."""
    return str(planted_dir)


def _load_unchanged(folder: Path):
    """Load a model folder for the whole session and, at its end, check that no test changed
    the shared model: weights, attention implementation and hooks as loaded."""
    import torch

    import headscope

    loaded = headscope.load(str(folder), device="cpu")
    model = loaded.model
    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    implementation = model.config._attn_implementation
    yield loaded
    changed = [name for name, tensor in model.state_dict().items() if not torch.equal(tensor, weights[name])]
    assert not changed, f"a test changed the shared planted model's weights {changed[:3]}: load planted_dir instead"
    assert model.config._attn_implementation == implementation, "a test left the planted model routed"
    hooked = [name for name, m in model.named_modules()
              if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks]
    assert not hooked, f"a test left hooks on the planted model: {hooked[:3]}"


@pytest.fixture(scope="session")
def planted(planted_dir):
    """The planted model loaded once for the session; tests read it and never change it."""
    yield from _load_unchanged(planted_dir)


@pytest.fixture(scope="session")
def planted_positions_dir(tmp_path_factory) -> Path:
    """The variant of `tests/support/planted_positions.py` (fixed-offset and rare-word heads) saved
    once as a model folder, for what loads it by path."""
    from tests.support.planted_positions import save_planted_positions

    return save_planted_positions(tmp_path_factory.mktemp("planted-positions"))


@pytest.fixture(scope="session")
def planted_positions(planted_positions_dir):
    """The variant loaded once for the session; tests read it and never change it."""
    yield from _load_unchanged(planted_positions_dir)


@pytest.fixture(scope="session")
def phase_change(tmp_path_factory):
    """The 2-layer toy model of `tests/support/phase_change.py` trained once for the session past its
    induction phase change, with `HeadscopeCallback` recording its timeline every `EVERY` steps:
    `root` (the session folder), `timeline` (the callback's folder), `losses`, `model` (trained,
    in eval mode; tests read it and never change it)."""
    from types import SimpleNamespace

    from headscope.training.callback import HeadscopeCallback
    from tests.support.phase_change import EVERY, STEPS, held_out, train_phase

    root = tmp_path_factory.mktemp("phase")
    callback = HeadscopeCallback(every=EVERY, out=root / "two", icl_data=held_out())
    losses, model = train_phase(2, STEPS, root / "run2", [callback])
    return SimpleNamespace(root=root, timeline=root / "two", losses=losses, model=model)


@pytest.fixture(scope="module")
def browser():
    """Chromium driven by Playwright (`tests/support/browser.py`), one per test module: skipped
    when either is missing, failed instead under `HEADSCOPE_REQUIRE_BROWSER=1`."""
    from tests.support.browser import chromium

    with chromium() as launched:
        yield launched
