"""The load cache: keys, atomic entries, damage, the `headscope cache` command (fast, no model)."""
import json
import os

import pytest
import torch
from typer.testing import CliRunner

from headscope.loading import load_cache as cache
from headscope.cli import app


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(bytes(range(256)) * (3 * 2**12))  # 3 MiB: a head, a middle and a tail
    return path


def _write_files(folder):
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\x01" * 1000)


def test_cache_root_follows_the_environment(own_cache, monkeypatch, tmp_path):
    assert cache.cache_root() == own_cache
    monkeypatch.delenv("HEADSCOPE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_root() == tmp_path / "xdg" / "headscope"


def test_key_changes_with_the_file_and_the_dtype(source, own_cache):
    key = cache.source_key(source, None)
    assert cache.source_key(source, None) == key
    assert cache.source_key(source, "torch.bfloat16").digest != key.digest
    assert cache.source_key(source, torch.float32) == key  # None: float32, what a GGUF file dequantises to
    stat = source.stat()
    for where in (0, stat.st_size - 1):  # first and last MiB, size and mtime put back
        data = bytearray(source.read_bytes())
        data[where] ^= 0xFF
        source.write_bytes(bytes(data))
        os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert cache.source_key(source, None).digest != key.digest
        data[where] ^= 0xFF
        source.write_bytes(bytes(data))
        os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert cache.source_key(source, None).digest == key.digest
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert cache.source_key(source, None).digest != key.digest
    with open(source, "ab") as fh:
        fh.write(b"\x00")
    assert cache.source_key(source, None).size == stat.st_size + 1


def test_store_and_lookup(source, own_cache):
    key = cache.source_key(source, None)
    assert cache.lookup(key) is None
    folder = cache.store(key, _write_files)
    assert cache.lookup(key) == folder
    manifest = json.loads((folder / cache.MANIFEST).read_text())
    assert manifest["files"] == {"config.json": 2, "model.safetensors": 1000}
    assert manifest["key"]["source"] == str(source.resolve())


def test_a_failed_write_leaves_nothing(source, own_cache):
    def broken(folder):
        _write_files(folder)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        cache.store(cache.source_key(source, None), broken)
    assert list((own_cache / "models").iterdir()) == []


def test_a_second_writer_of_the_same_entry_keeps_the_first(source, own_cache):
    key = cache.source_key(source, None)
    first = cache.store(key, _write_files)
    again = cache.store(key, lambda folder: (folder / "model.safetensors").write_bytes(b"\x02" * 7))
    assert again == first
    assert (first / "model.safetensors").read_bytes() == b"\x01" * 1000
    assert [p.name for p in (own_cache / "models").iterdir()] == [first.name]


def test_a_changed_file_replaces_its_older_entry(source, own_cache):
    old = cache.store(cache.source_key(source, None), _write_files)
    with open(source, "ab") as fh:
        fh.write(b"\x00")
    new = cache.store(cache.source_key(source, None), _write_files)
    assert new != old and not old.exists() and new.exists()


def test_entries_of_other_dtypes_stay_until_the_file_changes(source, own_cache):
    as_stored = cache.store(cache.source_key(source, None), _write_files)
    in_bf16 = cache.store(cache.source_key(source, "torch.bfloat16"), _write_files)
    assert as_stored.exists() and in_bf16.exists()  # one load in each dtype: no conversion thrashing
    assert cache.lookup(cache.source_key(source, None)) == as_stored
    with open(source, "ab") as fh:
        fh.write(b"\x00")
    new = cache.store(cache.source_key(source, None), _write_files)
    assert new.exists() and not as_stored.exists() and not in_bf16.exists()


def test_an_entry_of_another_format_is_removed_by_the_next_store(source, own_cache, monkeypatch):
    old = cache.store(cache.source_key(source, "torch.bfloat16"), _write_files)
    monkeypatch.setattr(cache, "FORMAT", cache.FORMAT + 1)
    new = cache.store(cache.source_key(source, None), _write_files)
    assert new.exists() and not old.exists()


def test_a_truncated_entry_is_reported_in_one_line_and_removed(source, own_cache, capfd):
    key = cache.source_key(source, None)
    folder = cache.store(key, _write_files)
    with open(folder / "model.safetensors", "r+b") as fh:
        fh.truncate(10)
    assert cache.lookup(key) is None
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) == 1 and "damaged" in lines[0] and "model.safetensors has 10 of 1000 bytes" in lines[0]
    assert not folder.exists()


def test_a_changed_byte_of_the_same_size_is_caught_by_the_checksum(source, own_cache, capfd):
    key = cache.source_key(source, None)
    folder = cache.store(key, _write_files)
    assert cache.lookup(key) == folder  # whole: found
    with open(folder / "model.safetensors", "r+b") as fh:
        fh.seek(500)
        byte = fh.read(1)
        fh.seek(500)
        fh.write(bytes([byte[0] ^ 0xFF]))  # same size, same name: only the content differs
    assert cache.lookup(key) is None
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) == 1 and "model.safetensors does not match its checksum" in lines[0]
    assert not folder.exists()


def test_an_entry_without_checksums_is_rebuilt(source, own_cache, capfd):
    """An entry written before checksums were recorded is not trusted."""
    key = cache.source_key(source, None)
    folder = cache.store(key, _write_files)
    manifest = json.loads((folder / cache.MANIFEST).read_text())
    del manifest["crc32"]
    (folder / cache.MANIFEST).write_text(json.dumps(manifest))
    assert cache.lookup(key) is None and "damaged" in capfd.readouterr().err


def test_cache_command_shows_and_clears(source, own_cache):
    cache.store(cache.source_key(source, None), _write_files)
    shown = CliRunner().invoke(app, ["cache"])
    assert shown.exit_code == 0, shown.output
    assert str(own_cache) in shown.output and "1 entries" in shown.output
    cleared = CliRunner().invoke(app, ["cache", "--clear"])
    assert cleared.exit_code == 0 and "removed" in cleared.output
    assert list((own_cache / "models").iterdir()) == []
    assert "0 entries, 0.0 MiB" in CliRunner().invoke(app, ["cache"]).output
