"""Giving freed heap back to the operating system once a model is loaded.

- `return_freed_heap()`: glibc's `malloc_trim(0)`; False (and nothing done) where there is no glibc.

Loading allocates and frees many mid-sized buffers (tokenizer tables, a GGUF file's tensors while
they are decoded, transformers' bookkeeping). glibc keeps freed blocks below its mmap threshold in
the process's heap for reuse, so they stay in the resident set after the load; `malloc_trim(0)`
returns the free pages of every arena. It frees only memory nobody holds, so it changes no result;
it walks the heap once (milliseconds), which is why `headscope.load` calls it once, at its end.
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
