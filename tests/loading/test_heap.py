"""Giving freed heap back after a load: glibc's malloc_trim where it exists, nothing elsewhere."""
import ctypes.util
import sys

import pytest

from headscope.loading import heap


@pytest.fixture
def fresh_lookup():
    heap._malloc_trim.cache_clear()
    yield
    heap._malloc_trim.cache_clear()


@pytest.mark.skipif(not sys.platform.startswith("linux") or "musl" in (ctypes.util.find_library("c") or ""),
                    reason="glibc only")
def test_glibc_trims(fresh_lookup):
    assert heap.return_freed_heap() is True


def test_elsewhere_nothing_is_done(fresh_lookup, monkeypatch):
    monkeypatch.setattr(heap.sys, "platform", "darwin")
    assert heap._malloc_trim() is None
    assert heap.return_freed_heap() is False


def test_a_libc_without_malloc_trim_is_skipped(fresh_lookup, monkeypatch):
    class NoTrim:  # musl's libc: loads, but has no such symbol
        def __init__(self, name):
            pass

    monkeypatch.setattr(heap.ctypes, "CDLL", NoTrim)
    assert heap.return_freed_heap() is False
