"""KV-cache policies from an analysis, and the files they are written to (DuoAttention, HeadKV)."""
import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from headscope.errors import HeadscopeError, HeadscopeWarning
from headscope.kv import KVPolicy, kv_policy, read_duo, read_headkv, read_policy, write_duo, write_headkv
from headscope.kv.formats import DUO_CONFIG, DUO_TSV
from headscope.kv.policy import TIE_STEP, cache_bytes, default_window, policy_from_values
from tests.support.fake_analysis import fake_analysis, fake_analysis_with_retrieval

N_LAYERS, N_HEADS = 4, 6  # fake_analysis: n_kv_heads = n_heads // 3 = 2, so 3 query heads per KV head


@pytest.fixture
def scores():
    s = np.zeros((N_LAYERS, N_HEADS))
    s[2, 4] = 0.8  # KV head (2, 1): query heads 3, 4, 5
    s[1, 0] = 0.5  # KV head (1, 0)
    s[3, 2] = 0.3  # KV head (3, 0)
    s[0, 5] = np.nan  # no counted example: the lowest
    return s


def test_a_kv_head_scores_its_strongest_query_head_and_the_top_fraction_is_full(scores):
    policy = kv_policy(fake_analysis_with_retrieval(scores), keep=0.375, sink=2, recent=5)  # round(0.375 * 8) = 3 of 8 KV heads
    assert policy.values.shape == (N_LAYERS, 2)
    close = dict(abs=TIE_STEP)  # the tie-breaking moves each value by at most TIE_STEP
    assert policy.values[2, 1] == pytest.approx(1.0, **close) and policy.values[1, 0] == pytest.approx(0.5 / 0.8, **close)
    assert policy.values[3, 0] == pytest.approx(0.3 / 0.8, **close) and policy.values[0, 1] == pytest.approx(0, **close)
    assert sorted(zip(*np.nonzero(policy.full))) == [(1, 0), (2, 1), (3, 0)]
    assert (policy.sink, policy.recent, policy.n_heads) == (2, 5, N_HEADS)
    assert len(policy.streaming) == 5


def test_ties_are_broken_by_layer_then_head(scores):
    policy = kv_policy(fake_analysis_with_retrieval(scores), keep=0.5)  # 4 full: the 3 scored heads, then the first zero
    assert sorted(zip(*np.nonzero(policy.full))) == [(0, 0), (1, 0), (2, 1), (3, 0)]


@pytest.mark.parametrize("keep", [0.125, 0.25, 0.5, 0.75])
def test_a_loader_that_sorts_the_values_picks_the_same_heads_despite_tied_scores(tmp_path, scores, keep):
    # Five of eight KV heads score 0: ties straddle every cut. kvpress's DuoAttentionPress streams the
    # round(size * ratio) lowest values by np.argsort (not stable); DuoAttention thresholds at a quantile.
    policy = kv_policy(fake_analysis_with_retrieval(scores), keep=keep)
    write_duo(policy, tmp_path / "duo")
    values = np.clip(np.loadtxt(tmp_path / "duo" / DUO_TSV, delimiter="\t"), 0, 1)
    assert len(np.unique(values)) == values.size
    n_streaming = round(values.size * (1 - policy.full.sum() / values.size))
    streaming = np.zeros(values.size, dtype=bool)
    streaming[np.argsort(values, axis=None)[:n_streaming]] = True
    assert np.array_equal(~streaming.reshape(values.shape), policy.full)
    threshold = np.quantile(values, 1 - policy.full.sum() / values.size, method="lower")
    assert np.array_equal(values > threshold, policy.full)


def test_razor_ranks_by_the_larger_of_induction_and_duplicate_token():
    analysis = fake_analysis(N_LAYERS, N_HEADS, with_syntax=False)
    policy = kv_policy(analysis, keep=0.25, rank_by="razor")
    s = analysis.scores
    table = np.zeros((N_LAYERS, N_HEADS))
    for name in ("induction", "duplicate_token"):
        rows = s[s.detector == name]
        table = np.maximum(table, pd.pivot(rows, index="layer", columns="head", values="score").to_numpy())
    kv = table.reshape(N_LAYERS, 2, 3).max(-1)  # by hand: strongest query head of each KV head
    best = np.unravel_index(np.argmax(kv), kv.shape)
    assert policy.full[best] and policy.full.sum() == 2


def test_default_window_is_duoattentions_for_large_models_and_smaller_below():
    assert default_window(7_000_000_000) == (128, 256)
    assert default_window(135_000_000) == (16, 64)
    policy = kv_policy(fake_analysis_with_retrieval(np.random.default_rng(0).random((N_LAYERS, N_HEADS))))
    assert (policy.sink, policy.recent) == (16, 64)  # the fake model has 5M parameters


def test_duo_folder_has_layers_by_kv_heads_in_unit_range_and_reads_back(tmp_path, scores):
    policy = kv_policy(fake_analysis_with_retrieval(scores), keep=0.25, sink=4, recent=32)
    write_duo(policy, tmp_path / "duo")
    table = np.loadtxt(tmp_path / "duo" / DUO_TSV, delimiter="\t")  # as DuoAttention reads it
    assert table.shape == (N_LAYERS, 2)
    assert ((table >= 0) & (table <= 1)).all()
    assert np.array_equal(np.clip(table, 0, 1), policy.values)
    config = json.loads((tmp_path / "duo" / DUO_CONFIG).read_text())
    assert (config["sink_size"], config["recent_size"]) == (4, 32)
    assert read_duo(tmp_path / "duo") == policy
    assert read_policy(tmp_path / "duo") == policy


def test_random_values_round_trip_bit_for_bit(tmp_path):
    values = np.random.default_rng(3).random((5, 4))
    policy = policy_from_values(values, 0.3, 8, 1, 7)
    write_duo(policy, tmp_path / "duo")
    back = read_duo(tmp_path / "duo")
    assert np.array_equal(back.values, values) and back == policy


def test_duoattention_folder_without_headscope_keys(tmp_path):
    # A folder as DuoAttention writes it: values only (some outside [0, 1], clipped with a warning) and the window.
    folder = tmp_path / "theirs"
    folder.mkdir()
    (folder / DUO_TSV).write_text("1.2\t0.1\n0.4\t-0.3\n")
    (folder / DUO_CONFIG).write_text(json.dumps({"sink_size": 128, "recent_size": 256}))
    with pytest.raises(HeadscopeError, match="pass keep"), pytest.warns(HeadscopeWarning, match="clipped"):
        read_duo(folder)
    with pytest.warns(HeadscopeWarning, match=r"2 value\(s\) lie outside \[0, 1\] \(from -0.3 to 1.2\); clipped"):
        policy = read_duo(folder, keep=0.5)
    assert policy.values.tolist() == [[1.0, 0.1], [0.4, 0.0]]
    assert policy.full.tolist() == [[True, False], [True, False]]
    assert (policy.sink, policy.recent) == (128, 256)


def test_headkv_json_has_layer_head_keys_and_reads_back(tmp_path, scores):
    policy = kv_policy(fake_analysis_with_retrieval(scores), keep=0.25, sink=4, recent=32)
    path = write_headkv(policy, tmp_path / "heads.json")
    data = json.loads(path.read_text())
    assert sorted(data) == sorted(f"{l}-{h}" for l in range(N_LAYERS) for h in range(N_HEADS))
    assert all(isinstance(v, list) and 0 <= v[0] <= 1 for v in data.values())
    assert data["2-4"][0] == pytest.approx(1.0, abs=TIE_STEP) and data["2-3"][0] == pytest.approx(0.0, abs=TIE_STEP)
    back = read_headkv(path, keep=0.25, n_kv_heads=2, sink=4, recent=32)
    assert back == policy
    assert np.array_equal(back.head_values, policy.head_values)
    assert read_policy(path, keep=0.25, n_kv_heads=2, sink=4, recent=32) == policy


def test_kv_bytes_count_full_heads_for_every_token_and_streaming_heads_for_their_window():
    policy = policy_from_values(np.array([[1.0, 0.0, 0.5]]), 1 / 3, 3, sink=2, recent=3)  # one full head
    # By hand: 2 (K and V) x d_head 8 x 2 bytes x (1 x 100 + 2 x (2 + 3)).
    assert policy.kv_bytes(100, d_head=8, bytes_per_value=2) == 2 * 8 * 2 * (100 + 2 * 5)
    assert cache_bytes(policy.full, 4, 2, 3, 8, 2) == 2 * 8 * 2 * (4 + 2 * 4)  # a window longer than the text


@pytest.mark.parametrize("keep", [0.0, -0.1, 1.5])
def test_keep_outside_the_unit_interval_is_a_one_line_error(keep, scores):
    with pytest.raises(HeadscopeError, match=r"in \(0, 1\]") as err:
        kv_policy(fake_analysis_with_retrieval(scores), keep=keep)
    assert "\n" not in str(err.value)


def test_an_analysis_without_the_ranking_detector_is_a_one_line_error():
    with pytest.raises(HeadscopeError, match="no 'retrieval' scores") as err:
        kv_policy(fake_analysis(N_LAYERS, N_HEADS, with_syntax=False))
    assert "\n" not in str(err.value)
    with pytest.raises(HeadscopeError, match="unknown ranking"):
        kv_policy(fake_analysis(N_LAYERS, N_HEADS, with_syntax=False), rank_by="loudest")


def test_bad_files_are_one_line_errors(tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps({"zero-one": [0.5]}))
    with pytest.raises(HeadscopeError, match="layer-head"):
        read_headkv(tmp_path / "bad.json", keep=0.5)
    (tmp_path / "holes.json").write_text(json.dumps({"0-0": [0.5], "1-1": [0.2]}))
    with pytest.raises(HeadscopeError, match="not all"):
        read_headkv(tmp_path / "holes.json", keep=0.5)
    (tmp_path / "empty").mkdir()
    with pytest.raises(HeadscopeError, match="not a DuoAttention"):
        read_duo(tmp_path / "empty")
    with pytest.raises(HeadscopeError, match="no policy"):
        read_policy(tmp_path / "missing")
    with pytest.raises(HeadscopeError, match="pass keep"):
        read_policy(tmp_path / "bad.json")


def test_a_multi_head_latent_attention_model_gets_no_per_head_policy(scores):
    """Its cache is one latent per token that every head reads: a policy and its evaluation are
    refused in one line (from the analysis's family, and from the loaded model's)."""
    import torch

    from headscope.kv import kv_evaluate
    from headscope.loading.loader import Loaded
    from tests.support.planted import char_tokenizer
    from tests.support.tiny import tiny_model

    analysis = fake_analysis_with_retrieval(scores)
    deepseek = dataclasses.replace(analysis, meta={**analysis.meta, "family": "deepseek_v3"})
    with pytest.raises(HeadscopeError, match="per-head KV-cache policies do not apply to deepseek_v3") as err:
        kv_policy(deepseek)
    assert "\n" not in str(err.value)
    policy = kv_policy(analysis)  # another family: a policy, of the fake analysis's shape
    torch.manual_seed(0)
    loaded = Loaded.from_model(tiny_model("deepseek_v2", kind="interface"), char_tokenizer(), "tiny-deepseek_v2")
    with pytest.raises(HeadscopeError, match="do not apply to deepseek_v2: its multi-head latent attention"):
        kv_evaluate(loaded, policy, lengths=(32,))
