"""glibc's heap during headscope's work: freed heap given back after a load, held for reuse
through an analysis's passes.

- `return_freed_heap()`: glibc's `malloc_trim(0)`; False (and nothing done) where there is no glibc.
- `heap_held()`: a context manager; inside it, glibc keeps freed heap for the next layer instead
  of handing it back to the operating system page by page. Leaving it gives the free pages back.
- `holding()`: whether a `heap_held()` is in force; `free_heap_bytes()`: the heap's free bytes.

glibc serves an allocation above its mmap threshold with a mapping of its own, returned when
freed, and smaller ones from the heap, where freed blocks stay resident for reuse. The threshold
starts at 128 KiB and rises to the size of each mapped block freed (up to 32 MiB); free heap at
the top above the trim threshold (twice the mmap threshold) goes back to the operating system
whenever a block there is freed. A forward pass allocates and frees each layer's activations,
so the same memory goes back and is faulted in again layer after layer: a plain forward of
SmolLM2 over the two pattern probes at 1024 x 4 tokens takes 0.6 to 1.6 million minor page
faults (1.1 to 2.7 s of system time), a number that varies from process to process with the
order the blocks are freed in.

`heap_held()` sets the mmap threshold to 32 MiB, the most glibc takes from `mallopt` (blocks
above stay mappings, as they are now), and the trim threshold to 2 GiB, so freed blocks stay
in the heap and the next layer reuses them without a fault. Each probe pass of an analysis
(`headscope.detectors.runner.collect`: the model's and the control twin's) runs inside it;
between the passes (building the twin, the OV table, the statistics) glibc's own policy applies,
so their temporaries do not add to a held heap. Held heap is bounded twice:
- every few layers (`headscope.detectors.runner.HELD_CHECK_TOKENS`) the pass reads the heap's
  free bytes (`mallinfo2`) and gives the heap back when they exceed `held_free_limit` (at least
  `HELD_FREE_FLOOR`, 256 MiB, or four times its first reading: a pass's own temporaries are
  not trimmed layer after layer, fragmentation that grows past them is);
- leaving the outermost `heap_held()` calls `malloc_trim(0)`, and sets the thresholds to glibc's
  ceiling (`CEILING_MMAP` 32 MiB, `CEILING_TRIM` 64 MiB: where its own adjustment ends once a
  block of 32 MiB has been freed, as in any process that ran a model). glibc has no call that
  turns its adjustment back on; that ceiling is what stays after an analysis.

Nothing is set where glibc is absent or older than 2.33 (no `mallinfo2`), or where the process
chose its own allocator settings (`MALLOC_*` variables, `glibc.malloc` tunables): those
processes keep the plain policy of `headscope.detectors.runner` (the heap given back every few
layers). `malloc_trim(0)` frees only memory nobody holds, and the thresholds decide only where a
block comes from: no result changes. `headscope.load` calls `return_freed_heap` once at its end
(tokenizer tables, a GGUF file's tensors while they are decoded).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from contextlib import contextmanager
from functools import lru_cache
from typing import Optional

__all__ = ["return_freed_heap", "heap_held", "holding", "free_heap_bytes", "held_free_limit"]

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (glibc's malloc.h)
HELD_MMAP = 32 << 20  # glibc refuses an mmap threshold above half its 64 MiB per-thread heap
HELD_TRIM = 2**31 - 1  # mallopt takes an int
CEILING_MMAP, CEILING_TRIM = 32 << 20, 64 << 20  # glibc's own adjustment ends here (DEFAULT_MMAP_THRESHOLD_MAX)
HELD_FREE_FLOOR = 256 << 20
HELD_FREE_FIRST = 4  # times the free heap at a pass's first reading


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@lru_cache(maxsize=1)
def _libc():
    """glibc, or None (macOS, Windows, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # glibc's own symbol (musl has none)
    except (OSError, AttributeError):
        return None
    return libc


@lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's malloc_trim, or None (macOS, Windows, musl: no such symbol)."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


@lru_cache(maxsize=1)
def _tuning():
    """(mallopt, mallinfo2) where the heap may be held, else None: glibc 2.33 or later, and no
    allocator settings of the process's own."""
    libc = _libc()
    if libc is None or _malloc_trim() is None:
        return None
    if any(key.startswith("MALLOC_") for key in os.environ) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return None
    try:
        mallopt, mallinfo2 = libc.mallopt, libc.mallinfo2
    except AttributeError:  # glibc before 2.33
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mallinfo2.argtypes, mallinfo2.restype = [], _MallInfo2
    return mallopt, mallinfo2


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


_lock = threading.Lock()
_depth = 0


def holding() -> bool:
    """Whether a `heap_held()` is in force and has set glibc's thresholds."""
    return _depth > 0 and _tuning() is not None


def free_heap_bytes() -> Optional[int]:
    """The free bytes of glibc's heap, every arena (`mallinfo2().fordblks`); None where the heap
    is not held."""
    tuning = _tuning()
    return None if tuning is None else int(tuning[1]().fordblks)


def held_free_limit(first_reading: int) -> int:
    """The free heap a held pass keeps before giving it back: `HELD_FREE_FLOOR` or
    `HELD_FREE_FIRST` times the free bytes of the pass's first reading, the larger."""
    return max(HELD_FREE_FLOOR, HELD_FREE_FIRST * first_reading)


@contextmanager
def heap_held():
    """Keep freed heap for reuse while inside (see the module's docstring); give it back on leaving.

    Reentrant: only the outermost sets the thresholds, and only it gives the heap back (also
    where the heap cannot be held: `return_freed_heap`).
    """
    global _depth
    tuning = _tuning()
    with _lock:
        outermost = _depth == 0
        _depth += 1
        if outermost and tuning is not None:
            tuning[0](M_MMAP_THRESHOLD, HELD_MMAP)
            tuning[0](M_TRIM_THRESHOLD, HELD_TRIM)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if outermost and tuning is not None:
                tuning[0](M_TRIM_THRESHOLD, CEILING_TRIM)
                tuning[0](M_MMAP_THRESHOLD, CEILING_MMAP)
        if outermost:
            return_freed_heap()
