"""What a folder holds, to check that a command left the user's files as they were:
`snapshot(root)` maps every file under `root` to its bytes and every folder to None, so two
snapshots are equal only when nothing was changed, added or removed."""
from pathlib import Path


def snapshot(root: Path) -> dict:
    """Every file under `root` (path -> bytes) and every folder (path -> None)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}
