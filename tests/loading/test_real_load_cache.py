"""The load cache on the bundled SmolLM2 GGUF file: exact equality with a fresh conversion and
with transformers' own loading, changed files, damaged entries, two processes at once (slow).

A conversion takes several seconds, so the file is copied and converted once per module
(`converted`); a test that damages an entry starts from a copy of that entry (`seeded`)."""
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch

import headscope
from headscope._paths import probes_dir
from headscope.loading import load_cache as cache
from headscope.loading.gguf_file import read_tensor_table
from headscope.loading.loader import ALIASES

pytestmark = pytest.mark.slow

TEXT = ["The cat sat on the mat because it was warm.", "Numbers like 42 and 7 appear here."]


@torch.no_grad()
def _logits(loaded):
    tok = loaded.tokenizer
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return loaded.model(**tok(TEXT, return_tensors="pt", padding=True)).logits


def _copy_of_the_file(folder: Path) -> Path:
    path = folder / "copy" / "SmolLM2.gguf"
    path.parent.mkdir()
    shutil.copy2(ALIASES["smollm2-135m"].location(), path)
    return path


@pytest.fixture
def gguf_copy(tmp_path):
    return _copy_of_the_file(tmp_path)


def _entries(root: Path) -> list[Path]:
    return sorted((root / "models").iterdir())


class Converted(NamedTuple):
    path: Path  # the module's copy of the file
    cache: Path  # the module's load cache, holding one entry
    entry: Path
    fresh: object  # loaded with cache=False
    first: object  # the load that converted and stored the entry
    fresh_wrote_nothing: bool


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("converted")
    path = _copy_of_the_file(root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HEADSCOPE_CACHE", str(root / "cache"))
        fresh = headscope.load(str(path), device="cpu", cache=False)
        wrote_nothing = not (root / "cache").exists()
        first = headscope.load(str(path), device="cpu")  # converts and stores
    (entry,) = _entries(root / "cache")
    return Converted(path, root / "cache", entry, fresh, first, wrote_nothing)


@pytest.fixture
def seeded(converted, own_cache) -> Path:
    """This test's own cache holding a copy of the module's entry (valid for `converted.path`)."""
    entry = own_cache / "models" / converted.entry.name
    shutil.copytree(converted.entry, entry)
    return entry


def test_cached_model_equals_a_fresh_conversion(converted, monkeypatch):
    fresh, first, entry = converted.fresh, converted.first, converted.entry
    assert converted.fresh_wrote_nothing  # cache=False writes nothing
    monkeypatch.setenv("HEADSCOPE_CACHE", str(converted.cache))
    second = headscope.load(str(converted.path), device="cpu")  # read from the entry
    assert second.model.name_or_path == str(entry)
    reference = _logits(fresh)
    assert torch.equal(_logits(first), reference)
    assert torch.equal(_logits(second), reference)
    assert second.tokenizer(TEXT)["input_ids"] == fresh.tokenizer(TEXT)["input_ids"]
    # Every bundled probe text and treebank, token for token (what the detectors are scored on).
    bundled = [path.read_text() for path in sorted(probes_dir().rglob("*")) if path.suffix in (".txt", ".conllu")]
    assert len(bundled) >= 14
    assert second.tokenizer(bundled)["input_ids"] == fresh.tokenizer(bundled)["input_ids"]
    assert second.tokenizer.chat_template == fresh.tokenizer.chat_template
    assert (second.family, second.causal, second.n_layers, second.n_heads) == ("llama", True, 30, 9)


def test_conversion_equals_transformers_own_gguf_loading(smollm2, smollm2_by_transformers):
    theirs, tokenizer = smollm2_by_transformers
    ours, reference = smollm2.model.state_dict(), theirs.state_dict()
    assert ours.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(ours[name], tensor), name
    assert smollm2.tokenizer(TEXT)["input_ids"] == tokenizer(TEXT)["input_ids"]
    assert type(smollm2.tokenizer) is type(tokenizer)


def test_a_modified_file_of_the_same_name_is_converted_again(gguf_copy, own_cache):
    before = headscope.load(str(gguf_copy), device="cpu")
    (old_entry,) = _entries(own_cache)
    stat = gguf_copy.stat()
    last = max(read_tensor_table(gguf_copy).tensors, key=lambda t: t.offset)
    assert (last.name, last.ggml_type) == ("output_norm.weight", 0)  # float32, at the file's end
    with open(gguf_copy, "r+b") as fh:  # double its values; same size, mtime put back
        fh.seek(stat.st_size - 1024)
        doubled = (np.frombuffer(fh.read(1024), dtype=np.float32) * 2).tobytes()
        fh.seek(stat.st_size - 1024)
        fh.write(doubled)
    os.utime(gguf_copy, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = headscope.load(str(gguf_copy), device="cpu")
    (new_entry,) = _entries(own_cache)  # the stale entry is gone
    assert new_entry != old_entry and after.model.name_or_path != str(old_entry)
    # What the edit made: the final norm's last 256 values doubled, every other tensor as it was.
    got, expected = after.model.state_dict(), dict(before.model.state_dict())
    norm = expected["model.norm.weight"].clone()
    assert last.offset + 4 * norm.numel() == stat.st_size - read_tensor_table(gguf_copy).data_start
    norm[-256:] *= 2
    expected["model.norm.weight"] = norm
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_float32_and_no_dtype_read_the_same_entry(converted, seeded, own_cache):
    """The module's entry was stored by a load with no dtype; float32 asks for the same weights."""
    loaded = headscope.load(str(converted.path), device="cpu", dtype="float32")
    assert _entries(own_cache) == [seeded] and loaded.model.name_or_path == str(seeded)
    assert next(loaded.model.parameters()).dtype == torch.float32


def test_a_truncated_entry_is_rebuilt_with_one_line(converted, seeded, capfd):
    path, entry = str(converted.path), seeded
    assert headscope.load(path, device="cpu").model.name_or_path == str(entry)  # the copy is read
    weights = entry / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as fh:
        fh.truncate(size // 2)
    capfd.readouterr()
    rebuilt = headscope.load(path, device="cpu")
    damaged = [line for line in capfd.readouterr().err.splitlines() if "damaged" in line]
    assert len(damaged) == 1 and str(entry) in damaged[0] and "rebuilding" in damaged[0]
    assert weights.stat().st_size == size
    assert torch.equal(_logits(rebuilt), _logits(converted.first))
    again = headscope.load(path, device="cpu")
    assert again.model.name_or_path == str(entry)


def test_a_damaged_header_is_rebuilt_with_one_line(converted, seeded, capfd):
    path, entry = str(converted.path), seeded
    with open(entry / "model.safetensors", "r+b") as fh:  # same size, unreadable header
        fh.write(b"\xff" * 64)
    capfd.readouterr()
    rebuilt = headscope.load(path, device="cpu")
    damaged = [line for line in capfd.readouterr().err.splitlines() if "damaged" in line]
    assert len(damaged) == 1 and str(entry) in damaged[0]
    assert rebuilt.n_layers == 30 and headscope.load(path, device="cpu").model.name_or_path == str(entry)


LOAD_AND_SAVE = textwrap.dedent("""
    import sys, torch, headscope
    loaded = headscope.load(sys.argv[1], device="cpu")
    tok = loaded.tokenizer
    tok.pad_token = tok.pad_token or tok.eos_token
    with torch.no_grad():
        logits = loaded.model(**tok({text!r}, return_tensors="pt", padding=True)).logits
    torch.save(logits, sys.argv[2])
""").format(text=TEXT)


def test_two_processes_loading_at_once(gguf_copy, own_cache, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(headscope.__file__).parents[1]),
                                                       os.environ.get("PYTHONPATH", "")]))
    outs = [tmp_path / f"logits{i}.pt" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", LOAD_AND_SAVE, str(gguf_copy), str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for out in outs]
    results = [p.communicate(timeout=600) for p in procs]
    for proc, (_, err) in zip(procs, results):
        assert proc.returncode == 0, err[-2000:]
    assert torch.equal(torch.load(outs[0]), torch.load(outs[1]))
    (entry,) = _entries(own_cache)  # one whole entry, no leftovers of the other writer
    assert cache.lookup(cache.source_key(gguf_copy, None)) == entry
    reread = headscope.load(str(gguf_copy), device="cpu")
    assert reread.model.name_or_path == str(entry)
    assert torch.equal(_logits(reread), torch.load(outs[0]))


def test_cli_no_cache_writes_nothing(gguf_copy, own_cache):
    from typer.testing import CliRunner

    from headscope.cli import app

    result = CliRunner().invoke(app, ["verify", str(gguf_copy), "--device", "cpu", "--no-cache"])
    assert result.exit_code == 0, result.output
    assert not own_cache.exists()
    result = CliRunner().invoke(app, ["verify", str(gguf_copy), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert len(_entries(own_cache)) == 1
