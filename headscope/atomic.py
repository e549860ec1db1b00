"""Output written atomically, under one rule for every command that writes (docs/reliability.md).

- `atomic_dir(target, force=False, protect=())`: a temporary folder that becomes `target` when the
  `with` block succeeds (analyses, reports, comparisons, DuoAttention policies, timelines,
  circuits, attributions: the command line's and the Python API's saves alike).
- `atomic_file(target, force=False, protect=(), ours=None)`: the same for one file (a HeadKV
  policy, a task file, the index.html `headscope report` re-renders in place).
- `write_text_atomic(path, text)`: one file written to a temporary name beside it, then renamed
  over whatever was there (the benchmarks' result files, which they own).

The rule, checked when either is made, before any work (`check_target`):
1. The target is never the working directory or a folder above it, and never is, holds or lies
   inside a path being read (`protect`: the model folder, the analyses, the policy, checkpoints).
2. An existing target is replaced only with `force`, and only when headscope wrote it: a folder
   carrying the marker `MARKER` (or an analysis folder from before the marker: meta.json and
   scores.csv) or an empty one; a file that `ours(its bytes)` recognises as one headscope
   wrote (each writer says how, e.g. `headscope.kv.formats.written_by_headscope`).
3. A target that cannot be written is refused: the nearest existing folder above it not
   writable, or an existing target that could not be renamed away and removed (a sticky folder
   such as /tmp where neither it nor its folder is the user's; a read-only folder inside it).
   A symbolic link as the target is refused (replacing it would replace the link, not its target).
4. Nothing temporary survives: on an exception, Ctrl-C, SIGTERM, or a rename the system refuses,
   the temporary file or folder (and any parent folder made for it) is removed and an existing
   target is left as it was; a refused rename is a one-line HeadscopeError naming the target.
The target is checked again at rename time, so one that appeared meanwhile (another run, the
user) is not replaced without `force`.

The marker, the manifest, the checks made when a folder headscope wrote is read (`check_folder`)
and the card a writer leaves in the marker for `headscope report --index` (`write_card`,
`read_card`) live in `headscope.folders`; their names are re-exported here.

- `exit_on_interrupt()`: the command line's Ctrl-C (and SIGTERM) handler: it removes the
  temporary files and folders being written (`temporary(path)` registers one), says in one line
  what was and was not written, and exits with status 130 (143) at once. No exception travels
  through torch's or transformers' imports (an interrupt raised inside them printed tracebacks,
  and once crashed the interpreter); a rename in progress (`critical()`) finishes first.
"""
from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Optional

from .errors import HeadscopeError
from .folders import MANIFEST, MARKER, MARKER_TEXT, check_folder, check_manifest, read_card, write_card, write_manifest

__all__ = ["atomic_dir", "atomic_file", "check_target", "MARKER", "MANIFEST", "write_manifest", "check_manifest",
           "write_card", "read_card",
           "check_folder", "exit_on_interrupt", "temporary", "critical", "write_text_atomic"]


def write_text_atomic(path, text: str) -> Path:
    """Write `text` to a temporary file beside `path`, then rename it to `path`, replacing what was
    there (the benchmarks' result files, which they own; every output of the library and the
    command line goes through `atomic_dir` or `atomic_file` and their rule). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would make the file private
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# ---------------------------------------------------------------- interrupts

_TEMPORARY: set = set()  # files and folders being written: removed when the process is interrupted
_PARENTS: list = []  # the parent folders made for them (lists, outermost first): removed too, if empty
_WRITTEN: list = []  # targets this process finished writing
_STATE = {"critical": 0, "pending": None}


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except OSError:
            pass


@contextmanager
def temporary(path):
    """Register `path` (a temporary file or folder) for removal should the process be interrupted."""
    _TEMPORARY.add(Path(path))
    try:
        yield path
    finally:
        _TEMPORARY.discard(Path(path))


@contextmanager
def critical():
    """A rename sequence an interrupt must not cut in half: the interrupt waits for its end."""
    _STATE["critical"] += 1
    try:
        yield
    finally:
        _STATE["critical"] -= 1
        if not _STATE["critical"] and _STATE["pending"] is not None:
            _interrupted(_STATE["pending"])


def _interrupted(signum) -> None:
    for path in list(_TEMPORARY):
        _remove(path)
    for made in list(_PARENTS):
        _unmake(made)
    what = ("nothing was written" if not _WRITTEN else
            "written completely: " + ", ".join(str(p) for p in _WRITTEN))
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    name = "terminated" if signum == signal.SIGTERM else "interrupted"
    os.write(2, f"headscope: {_torchrun_rank()}{name}; {what}\n".encode())
    os._exit(143 if signum == signal.SIGTERM else 130)


def _torchrun_rank() -> str:
    """"rank N: " in a process torchrun started (its RANK and WORLD_SIZE), else nothing: when
    torchrun stops every process of a group, each line says whose it is."""
    try:
        rank, size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return ""
    return f"rank {rank}: " if size > 1 else ""


def _on_signal(signum, frame) -> None:
    if _STATE["critical"]:
        _STATE["pending"] = signum
        return
    _interrupted(signum)


def exit_on_interrupt() -> None:
    """Install the command line's SIGINT and SIGTERM handler (see the module docstring)."""
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)


# ---------------------------------------------------------------- the rule for every target

def _written_by_headscope(folder: Path) -> bool:
    return (folder / MARKER).is_file() or ((folder / "meta.json").is_file() and (folder / "scores.csv").is_file())


def _replaceable(target: Path, folder: bool, ours: Optional[Callable]) -> bool:
    """Whether `--force` may replace the existing `target` (rule 2)."""
    if folder:
        return _written_by_headscope(target) or not any(target.iterdir())
    try:
        return ours is not None and bool(ours(target.read_bytes()))
    except OSError:
        return False


def _within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def _check_removable(target: Path) -> None:
    """HeadscopeError unless this process could rename `target` away and delete it (rule 3)."""
    parent = target.parent
    euid = os.geteuid() if hasattr(os, "geteuid") else 0
    sticky = parent.stat().st_mode & stat.S_ISVTX
    if sticky and euid != 0 and euid not in (target.lstat().st_uid, parent.stat().st_uid):
        raise HeadscopeError(f"cannot replace {target}: {parent} is a sticky folder (as /tmp is) and neither it nor "
                             f"{target.name} is yours, so {target.name} cannot be renamed; choose another output")
    if target.is_dir():
        for folder in [target, *(p for p in target.rglob("*") if p.is_dir() and not p.is_symlink())]:
            if not os.access(folder, os.W_OK | os.X_OK):
                raise HeadscopeError(f"cannot replace {target}: {folder} is read-only, so the old files could not be "
                                     f"removed; choose another output")


def check_target(target, *, folder: bool = True, force: bool = False, protect=(), ours: Optional[Callable] = None,
                 ) -> None:
    """HeadscopeError in one line when `target` may not be written (rules 1-3 of the module
    docstring); `folder`: a folder (else one file); `ours(bytes)`: whether an existing file is
    one headscope wrote. Paths in `protect` that do not exist (an alias, a hub id) are skipped."""
    target = Path(target)
    what = "folder" if folder else "file"
    resolved = target.resolve()
    if target.name in ("", ".", "..") or _within(Path.cwd().resolve(), resolved):
        raise HeadscopeError(f"{target} is the working directory or a folder above it; name a new {what} to write")
    for path in protect:
        if path is None or not Path(path).exists():
            continue
        read = Path(path).resolve()
        if _within(read, resolved):
            raise HeadscopeError(f"{target} is or holds {path}, which is being read; choose another output {what}")
        if _within(resolved, read):
            raise HeadscopeError(f"{target} lies inside {path}, which is being read; write outside the inputs")
    if target.is_symlink():
        raise HeadscopeError(f"{target} is a symbolic link; name the {what} to write itself")
    if target.exists():
        if folder and not target.is_dir():
            raise HeadscopeError(f"{target} exists and is not a folder")
        if not folder and target.is_dir():
            raise HeadscopeError(f"{target} is a folder; name a file to write")
        if not force:
            raise HeadscopeError(f"{target} already exists; pass --force (force=True) to replace it")
        if not _replaceable(target, folder, ours):
            if folder:
                raise HeadscopeError(f"{target} holds files headscope did not write; --force replaces only folders "
                                     f"headscope wrote, so choose another output folder")
            raise HeadscopeError(f"{target} is not a file headscope wrote (or it was edited since); --force replaces "
                                 f"only files headscope wrote, so choose another output file")
        _check_removable(target)
    parent = next(p for p in resolved.parents if p.exists())  # the nearest that exists
    if not parent.is_dir():
        raise HeadscopeError(f"{parent} is a file, so nothing can be written under it; choose another output {what}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise HeadscopeError(f"cannot write to {parent} (permission denied); choose another output {what}")


def _missing_parents(folder: Path) -> list:
    """`folder` and those of its parents that do not exist, outermost first."""
    return [p for p in reversed([folder, *folder.parents]) if not p.exists()]


def _unmake(made: list) -> None:
    """Remove the parent folders made for a target, innermost first, while they are empty."""
    for path in reversed(made):
        try:
            path.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            break


class _Atomic:
    """What `atomic_dir` and `atomic_file` share: the checks, the rename, the clean-up."""

    folder = True

    def __init__(self, target, *, force: bool = False, protect=(), ours: Optional[Callable] = None):
        self.target, self.force, self.ours = Path(target), force, ours
        check_target(self.target, folder=self.folder, force=force, protect=protect, ours=ours)
        self.existed = self.target.exists()

    def __enter__(self) -> Path:
        self.made = _missing_parents(self.target.parent)
        _PARENTS.append(self.made)
        try:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            self.tmp = self._make_temporary()
        except OSError as err:
            _unmake(self.made)
            _PARENTS.remove(self.made)
            raise HeadscopeError(f"cannot write {self.target} ({err.strerror or err}); choose another output") from None
        _TEMPORARY.add(self.tmp)
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        try:
            with critical():
                return self._finish(exc_type)
        finally:
            _TEMPORARY.discard(self.tmp)
            _PARENTS.remove(self.made)

    def _finish(self, exc_type) -> bool:
        if exc_type is not None:
            self._discard()
            return False
        try:
            self._seal()
            if self.target.exists() or self.target.is_symlink():
                if not (self.force and not self.target.is_symlink()
                        and _replaceable(self.target, self.folder, self.ours)):
                    raise HeadscopeError(f"{self.target} appeared while this ran (another run?); it was left as it is "
                                         f"and nothing was written")
                self._replace()
            else:
                os.rename(self.tmp, self.target)
        except OSError as err:
            self._discard()
            raise HeadscopeError(f"could not put {self.target} in place ({err.strerror or err}); it was left as it "
                                 f"was and nothing was written") from None
        except BaseException:
            self._discard()
            raise
        _WRITTEN.append(self.target)
        return False

    def _discard(self) -> None:
        _remove(self.tmp)
        _unmake(self.made)


class atomic_dir(_Atomic):
    """Context manager giving a temporary folder that is renamed to `target` on success.

    On an exception (Ctrl-C included) the temporary folder is deleted and `target` is left as
    it was. With `force`, an existing target that headscope wrote is replaced only after the new
    one is complete.

    Args:
        target: the folder to write.
        force: replace an existing folder headscope wrote (or an empty one).
        protect: paths being read (a model folder, analyses being compared) that the target must
            neither be, hold nor lie inside.
    Raises:
        HeadscopeError: before any work, when the rule of the module docstring refuses the
            target; at rename time, for a target that appeared meanwhile or a rename the
            system refuses (the temporary folder is then removed).
    """

    def __init__(self, target, *, force: bool = False, protect=()):
        super().__init__(target, force=force, protect=protect)

    def _make_temporary(self) -> Path:
        return Path(tempfile.mkdtemp(prefix=f".{self.target.name}.tmp-", dir=self.target.parent))

    def _seal(self) -> None:
        if not (self.tmp / MARKER).is_file():  # a writer's card (write_card) is a marker already
            (self.tmp / MARKER).write_text(MARKER_TEXT, encoding="utf-8")
        os.chmod(self.tmp, 0o755)

    def _replace(self) -> None:
        old = self.target.with_name(f".{self.target.name}.old-{os.getpid()}")
        os.replace(self.target, old)
        try:
            os.replace(self.tmp, self.target)
        except OSError:
            os.replace(old, self.target)  # put the old folder back
            raise
        shutil.rmtree(old, ignore_errors=True)


class atomic_file(_Atomic):
    """Context manager giving a temporary file beside `target`, renamed to `target` on success.

    Args:
        target: the file to write.
        force: replace an existing file that `ours` recognises as one headscope wrote.
        protect: paths being read, which the target must neither be, hold nor lie inside.
        ours: `fn(bytes) -> bool`: whether an existing file's content is one headscope wrote.
    Raises:
        HeadscopeError: as `atomic_dir`.
    """

    folder = False

    def _make_temporary(self) -> Path:
        fd, name = tempfile.mkstemp(prefix=f".{self.target.name}.tmp-", dir=self.target.parent)
        os.close(fd)
        return Path(name)

    def _seal(self) -> None:
        os.chmod(self.tmp, 0o644)  # mkstemp's 0600 would hide the file from the user's other tools

    def _replace(self) -> None:
        os.replace(self.tmp, self.target)
