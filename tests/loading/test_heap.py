"""glibc's heap: freed heap given back after a load (malloc_trim where it exists, nothing
elsewhere), held for reuse through an analysis (`heap_held`)."""
import ctypes.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from headscope.loading import heap


GLIBC = sys.platform.startswith("linux") and "musl" not in (ctypes.util.find_library("c") or "")


def _clear():
    for cached in (heap._libc, heap._malloc_trim, heap._tuning):
        cached.cache_clear()


@pytest.fixture
def fresh_lookup():
    _clear()
    yield
    _clear()


@pytest.mark.skipif(not GLIBC, reason="glibc only")
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


class _Recorder:
    def __init__(self):
        self.calls = []

    def mallopt(self, parameter, value):
        self.calls.append((parameter, value))
        return 1


def test_only_the_outermost_holding_sets_and_gives_back(monkeypatch):
    """Nested `heap_held` blocks (analyze around its probe passes): the thresholds are set on
    entering the outermost and set to glibc's ceiling on leaving it, where the heap goes back once."""
    glibc, trims = _Recorder(), []
    monkeypatch.setattr(heap, "_tuning", lambda: (glibc.mallopt, None))
    monkeypatch.setattr(heap, "return_freed_heap", lambda: trims.append(1) or True)
    assert not heap.holding()
    with heap.heap_held():
        assert heap.holding() and len(glibc.calls) == 2
        with heap.heap_held():
            assert heap.holding()
        assert len(glibc.calls) == 2 and trims == []
    assert not heap.holding() and trims == [1]
    assert glibc.calls == [(heap.M_MMAP_THRESHOLD, heap.HELD_MMAP), (heap.M_TRIM_THRESHOLD, heap.HELD_TRIM),
                           (heap.M_TRIM_THRESHOLD, heap.CEILING_TRIM), (heap.M_MMAP_THRESHOLD, heap.CEILING_MMAP)]


def test_an_error_inside_still_gives_back(monkeypatch):
    glibc, trims = _Recorder(), []
    monkeypatch.setattr(heap, "_tuning", lambda: (glibc.mallopt, None))
    monkeypatch.setattr(heap, "return_freed_heap", lambda: trims.append(1) or True)
    with pytest.raises(ValueError), heap.heap_held():
        raise ValueError("a failed pass")
    assert not heap.holding() and trims == [1] and len(glibc.calls) == 4


def test_without_tuning_nothing_is_held_but_the_heap_goes_back(monkeypatch):
    trims = []
    monkeypatch.setattr(heap, "_tuning", lambda: None)
    monkeypatch.setattr(heap, "return_freed_heap", lambda: trims.append(1) or True)
    with heap.heap_held():
        with heap.heap_held():
            assert not heap.holding() and heap.free_heap_bytes() is None
    assert trims == [1]


@pytest.mark.skipif(not GLIBC, reason="glibc only")
@pytest.mark.parametrize("setting", [{"MALLOC_MMAP_THRESHOLD_": "65536"},
                                     {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000000"}])
def test_the_process_own_allocator_settings_are_left_alone(fresh_lookup, monkeypatch, setting):
    for key, value in setting.items():
        monkeypatch.setenv(key, value)
    assert heap._tuning() is None


HELD = textwrap.dedent("""
    import json, torch
    from pathlib import Path
    from headscope.loading import heap

    def rss():
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

    out = {"holds": heap._tuning() is not None}
    with heap.heap_held():
        block = torch.ones(24 << 18)  # 24 MiB of floats, below the held 32 MiB mmap threshold
        before = rss()
        del block
        out["kept"] = before - rss()  # freed, still resident
        out["free"] = heap.free_heap_bytes()
        inside = rss()
    out["returned"] = inside - rss()
    print(json.dumps(out))
""")


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_a_held_block_stays_resident_until_the_holding_ends():
    """In a fresh process with glibc's defaults: a 24 MiB tensor freed inside `heap_held` stays
    resident and counts as free heap; leaving gives it back."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("MALLOC_") and key != "GLIBC_TUNABLES"}
    done = subprocess.run([sys.executable, "-c", HELD], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if not found["holds"]:
        pytest.skip("glibc before 2.33: no mallinfo2")
    mib = 2**20
    assert found["kept"] < 4 * mib
    assert found["free"] >= 24 * mib
    assert found["returned"] >= 20 * mib
