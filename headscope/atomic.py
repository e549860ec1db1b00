"""Folders written atomically: `atomic_dir(target, force=False)` gives a temporary folder that
becomes `target` only when the `with` block succeeds (analyses, reports, comparisons)."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .errors import HeadscopeError

__all__ = ["atomic_dir"]


class atomic_dir:
    """Context manager giving a temporary folder that is renamed to `target` on success.

    On an exception (Ctrl-C included) the temporary folder is deleted and `target` is left as
    it was. With `force`, an existing target is replaced only after the new one is complete.
    """

    def __init__(self, target, *, force: bool = False):
        self.target = Path(target)
        if self.target.exists() and not force:
            raise HeadscopeError(f"{self.target} already exists; pass --force (force=True) to replace it")
        if self.target.exists() and not self.target.is_dir():
            raise HeadscopeError(f"{self.target} exists and is not a folder")
        self.force = force

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.tmp-", dir=self.target.parent))
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        os.chmod(self.tmp, 0o755)
        if self.target.exists():
            old = self.target.with_name(f".{self.target.name}.old-{os.getpid()}")
            os.replace(self.target, old)
            os.replace(self.tmp, self.target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(self.tmp, self.target)
        return False
