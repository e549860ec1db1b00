"""The steps of a training run on disk, for `headscope timeline SOURCE...`.

- `snapshots(sources)` -> (`[Snapshot]` in step order, `{step: training loss}`), from
    * one Trainer output folder: its `checkpoint-*` subfolders, each step read from the
      checkpoint's own `trainer_state.json` (`global_step`), the training loss from the last
      checkpoint's `log_history`;
    * local model folders: the step from the folder's `trainer_state.json`, else the number that
      ends its name (`step-300`, `checkpoint-300`);
    * hub revisions `org/name@revision`, read offline from the Hugging Face cache, the step the
      number that ends the revision (`step1000`, as Pythia names them).
  Every snapshot must be the same model (type, layers, heads, width, vocabulary) and every step
  known and distinct; anything else is a `HeadscopeError` of one line. Each file is checked as
  it is read, the fault named with its file and field: config.json and trainer_state.json must
  be JSON objects, the shape fields whole numbers >= 1, `global_step` a whole number >= 0, each
  `log_history` entry's step and loss numbers; a checkpoint's weights are loaded under `load`'s
  checks (`headscope.loading.loader.load_model_only` without a tokenizer).
- `timeline_of(snapshots, losses, ...)` -> `Timeline`: every snapshot loaded and recorded in
  step order (control: the step-0 snapshot when there is one, else the random-init twin).
- `write_series(sources, guard, ...)`: the `headscope timeline` command: the series checked,
  recorded, and written into the `atomic_dir` `guard` (tables and index.html).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from ..errors import HeadscopeError
from ..loading import loader
from .report import write_timeline_report
from .timeline import Timeline

__all__ = ["Snapshot", "snapshots", "timeline_of", "write_series", "SHAPE_KEYS"]

SHAPE_KEYS = (("model_type",), ("num_hidden_layers", "n_layer"), ("num_attention_heads", "n_head"),
              ("hidden_size", "n_embd", "d_model"), ("vocab_size",))
_TRAILING = re.compile(r"(\d+)$")


@dataclass(frozen=True)
class Snapshot:
    """One model of the series: its training step, the folder it loads from, what to call it."""

    step: int
    path: Path
    name: str


def _json(path: Path) -> dict:
    """A JSON object from `path`; HeadscopeError naming the file otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise HeadscopeError(f"cannot read {path} as JSON (cut or edited?): {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise HeadscopeError(f"{path} holds a JSON {type(data).__name__}; expected an object")
    return data


def _whole(value, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _config(folder: Path, name: str) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise HeadscopeError(f"{name} holds no model (no config.json in {folder})")
    config = _json(path)
    for keys in SHAPE_KEYS[1:]:  # the numbers the series is compared on, and the model is built from
        for key in keys:
            if key in config and not _whole(config[key], 1):
                raise HeadscopeError(f"{path}: {key} is {config[key]!r}; expected a whole number >= 1")
    return config


def _shape(config: dict) -> dict:
    shape = {}
    for keys in SHAPE_KEYS:
        shape[keys[0]] = next((config[k] for k in keys if k in config), None)
    return shape


def _state_step(folder: Path) -> Optional[int]:
    path = folder / "trainer_state.json"
    if not path.is_file():
        return None
    step = _json(path).get("global_step")
    if not _whole(step, 0):
        raise HeadscopeError(f"{path}: global_step is {step!r}; expected a whole number >= 0")
    return step


def _losses(path: Path) -> dict:
    """{step: training loss} from a trainer_state.json's log_history (entries without a loss skipped)."""
    history = _json(path).get("log_history", [])
    if not isinstance(history, list):
        raise HeadscopeError(f"{path}: log_history is a {type(history).__name__}; expected a list of entries")
    losses = {}
    for number, row in enumerate(history):
        if not isinstance(row, dict) or "loss" not in row:
            continue
        step, loss = row.get("step"), row["loss"]
        if not _whole(step, 0) or isinstance(loss, bool) or not isinstance(loss, (int, float)):
            raise HeadscopeError(f"{path}: log_history entry {number} has step {step!r} and loss {loss!r}; expected "
                                 f"a whole number and a number")
        losses[step] = float(loss)
    return losses


def _trainer_folder(folder: Path) -> tuple[list[Snapshot], dict]:
    found = sorted((p for p in folder.iterdir() if p.is_dir() and p.name.startswith("checkpoint-")),
                   key=lambda p: int(_TRAILING.search(p.name).group(1)) if _TRAILING.search(p.name) else -1)
    if not found:
        raise HeadscopeError(f"{folder} has no checkpoint-* folders (save checkpoints with save_steps, or name model "
                             f"folders one by one)")
    out = []
    for path in found:
        step = _state_step(path)
        if step is None:
            raise HeadscopeError(f"{path.name} has no trainer_state.json: its step is unknown")
        named = _TRAILING.search(path.name)
        if named and int(named.group(1)) != step:
            raise HeadscopeError(f"{path.name}'s trainer_state.json says step {step}")
        out.append(Snapshot(step, path, path.name))
    return out, _losses(found[-1] / "trainer_state.json")


def _hub(spec: str) -> Snapshot:
    repo, revision = spec.rsplit("@", 1)
    named = _TRAILING.search(revision)
    if not named:
        raise HeadscopeError(f"cannot tell the step of {spec}: name revisions that end in their step (step1000)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = snapshot_download(repo, revision=revision, local_files_only=True)
    except (LocalEntryNotFoundError, OSError, ValueError) as err:
        raise HeadscopeError(f"{spec} is not in the Hugging Face cache (the timeline reads hub revisions offline): "
                             f"{str(err).splitlines()[0]}") from None
    return Snapshot(int(named.group(1)), Path(path), spec)


def snapshots(sources: Iterable[str]) -> tuple[list[Snapshot], dict]:
    """The series the sources name, checked (see the module docstring)."""
    sources = list(sources)
    if not sources:
        raise HeadscopeError("name a Trainer output folder, model folders, or hub revisions org/name@revision")
    losses: dict = {}
    if len(sources) == 1 and Path(sources[0]).is_dir() and not (Path(sources[0]) / "config.json").is_file():
        found, losses = _trainer_folder(Path(sources[0]))
    else:
        found = []
        for source in sources:
            path = Path(source)
            if path.is_dir():
                step = _state_step(path)
                named = _TRAILING.search(path.resolve().name)
                if step is None and not named:
                    raise HeadscopeError(f"cannot tell the step of {source}: no trainer_state.json and no number "
                                         f"ending its name")
                found.append(Snapshot(step if step is not None else int(named.group(1)), path, source))
            elif "@" in source and not path.exists():
                found.append(_hub(source))
            else:
                raise HeadscopeError(f"{source} is neither a model folder nor a hub revision org/name@revision")
    found.sort(key=lambda s: s.step)
    seen = {}
    for snap in found:
        if snap.step in seen:
            raise HeadscopeError(f"{seen[snap.step]} and {snap.name} are both step {snap.step}")
        seen[snap.step] = snap.name
    first = _shape(_config(found[0].path, found[0].name))
    for snap in found[1:]:
        shape = _shape(_config(snap.path, snap.name))
        differ = [f"{k} {shape[k]} vs {first[k]}" for k in first if shape[k] != first[k]]
        if differ:
            raise HeadscopeError(f"{snap.name} is not the same model as {found[0].name}: {', '.join(differ)}")
    return found, losses


def _loss_at(losses: dict, step: int) -> Optional[float]:
    """The training loss logged at `step`, else the last one logged before it."""
    before = [s for s in losses if s <= step]
    return losses[max(before)] if before else None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def _load(folder: Path, device: str) -> loader.Loaded:
    """`headscope.load` for a folder with a tokenizer; the model alone for one trained from token
    ids (no tokenizer files: the timeline's probes are then built from ids)."""
    if any((folder / name).is_file() for name in TOKENIZER_FILES):
        return loader.load(str(folder), device=device)
    return loader.load_model_only(folder, device=device)


def timeline_of(found: list[Snapshot], losses: dict, *, detectors=None, device: str = "cpu", seed: int = 0,
                progress: Optional[Callable] = None) -> Timeline:
    """Load and record every snapshot in step order; `progress(done, total)` after each."""
    timeline = None
    for done, snap in enumerate(found, 1):
        loaded = _load(snap.path, device)
        if timeline is None:
            timeline = Timeline(detectors, tokenizer=loaded.tokenizer, seed=seed)
        timeline.record(loaded.model, snap.step, train_loss=_loss_at(losses, snap.step))
        if progress is not None:
            progress(done, len(found))
    return timeline


def write_series(sources: Iterable[str], guard, *, detectors=None, device: str = "cpu", seed: int = 0,
                 plotlyjs: str = "embed", progress: Optional[Callable] = None) -> Timeline:
    """Check the series, record every snapshot, write the folder through `guard` (an `atomic_dir`)."""
    found, losses = snapshots(sources)
    timeline = timeline_of(found, losses, detectors=detectors, device=device, seed=seed, progress=progress)
    timeline._kept_control = False  # the step-0 model is one of the sources: no copy in the folder
    with guard as tmp:
        timeline.write_into(Path(tmp))
        write_timeline_report(tmp, plotlyjs, title=", ".join(str(s) for s in sources)[:200])
    return timeline
