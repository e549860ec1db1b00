"""Splitting probe batches across processes started by torchrun (torch.distributed).

- `process_device(device)`: the device this process runs on: "auto" resolved (cuda, mps,
  cpu), and under torchrun a CUDA device becomes this process's own GPU, "cuda:LOCAL_RANK".
- `init_from_env(device)`: joins the process group when torchrun set WORLD_SIZE > 1 (nccl on
  CUDA, gloo otherwise); returns (rank, world_size).
- `rank_and_size()`: (0, 1) outside a process group.
- `mine(index)`: whether this rank computes batch `index` (batches are dealt round-robin).
- `gather(items)`: every rank's list of (batch index, result), merged in batch order.
Each batch is computed exactly as in a single process (same examples, same shapes), so the
gathered per-example statistics, and the scores, intervals and labels built from them, are
identical to a single-process run with the same seed.
"""
from __future__ import annotations

import os
from datetime import timedelta

from .loader import resolve_device

__all__ = ["init_from_env", "rank_and_size", "mine", "gather", "local_device", "process_device"]


def rank_and_size() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def local_device(device: str) -> str:
    """One GPU per process under torchrun: "cuda" becomes "cuda:LOCAL_RANK"."""
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        return f"cuda:{os.environ['LOCAL_RANK']}"
    return device


def process_device(device: str = "auto") -> str:
    """This process's device: `device` resolved ("auto" -> cuda, mps or cpu), then its own GPU
    under torchrun (LOCAL_RANK); a device map (None) passes through."""
    if device is None:
        return device
    return local_device(resolve_device(device))


def init_from_env(device: str) -> tuple[int, int]:
    """Join torchrun's process group if there is one; a no-op for a single process.

    Args:
        device: as given on the command line ("auto", "cpu", "cuda", ...): the backend is nccl
            when it resolves to CUDA, gloo otherwise.
    """
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return rank_and_size()
    mine_ = process_device(device)
    backend = "nccl" if mine_.startswith("cuda") else "gloo"
    if backend == "nccl":
        import torch

        torch.cuda.set_device(mine_)  # nccl binds each rank to the current device
    dist.init_process_group(backend=backend, timeout=timedelta(minutes=30))
    return rank_and_size()


def mine(index: int) -> bool:
    rank, size = rank_and_size()
    return index % size == rank


def gather(items: list) -> list:
    """Merge every rank's `[(batch index, result), ...]` into one list in batch order."""
    import torch.distributed as dist

    rank, size = rank_and_size()
    if size == 1:
        return [result for _, result in sorted(items, key=lambda x: x[0])]
    everyone = [None] * size
    dist.all_gather_object(everyone, items)
    merged = [pair for part in everyone for pair in part]
    return [result for _, result in sorted(merged, key=lambda x: x[0])]
