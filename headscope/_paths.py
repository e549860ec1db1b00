"""Where headscope's data files live.

The probe corpora sit in the repository's top-level ``probes/`` folder; a built wheel carries
the same folder as ``headscope/_probes`` (see pyproject.toml).
"""
from pathlib import Path

__all__ = ["probes_dir"]


def probes_dir() -> Path:
    """The folder holding the probe corpora and treebanks."""
    here = Path(__file__).resolve().parent
    installed = here / "_probes"
    return installed if installed.is_dir() else here.parent / "probes"
