"""Giving freed heap back to the operating system: after a load, every few layers of an analysis.

- `return_freed_heap()`: glibc's `malloc_trim(0)`; False (and nothing done) where there is no glibc.

glibc serves an allocation above its mmap threshold with a mapping of its own, returned when
freed, and smaller ones from the heap, where freed blocks stay resident for reuse. The threshold
starts at 128 KiB and rises to the size of each mapped block freed (up to 32 MiB), so after the
first large tensor is freed, a layer's activations and a detector's temporaries all come from the
heap; freed, fragmented, they keep the process's resident set above what it holds.
`malloc_trim(0)` returns the free pages of every arena. It frees only memory nobody holds, so it
changes no result, and needs no environment variable (MALLOC_MMAP_THRESHOLD_) from the user.
`headscope.load` calls it once at its end (tokenizer tables, a GGUF file's tensors while they
are decoded); `analyze`'s passes after every sixth layer's reductions, or after more layers where
six have not yet run 24,576 tokens (`headscope.detectors.runner.TRIM_EVERY`, `TRIM_TOKENS`: a
treebank's small batches), and once at the end (one walk over the heap's free
blocks per call; the pages returned are faulted in again when the next layers allocate, which is
what trimming after every layer would cost in time).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import lru_cache

__all__ = ["return_freed_heap"]


@lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's malloc_trim, or None (macOS, Windows, musl: no such symbol)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def return_freed_heap() -> bool:
    """Return the heap's free pages to the operating system (glibc `malloc_trim(0)`).

    Returns:
        True when glibc's malloc_trim was called, False where it is absent (then nothing is done).
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
