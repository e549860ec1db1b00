"""Every table of heads an analysis keeps names each head's attention site: a last column `site`,
the module path of that layer's attention, beside `layer` and `head`.

The reference is the model itself: `model.get_submodule(site)` must be the very module the
family's code puts at that layer (GPT-2's `transformer.h[i].attn`, BART's decoder
`layers[i].encoder_attn`, jamba's `layers[i].self_attn` under the model's own layer number).
Folders saved before the column existed still load: the column comes from meta.json's site
modules where it records them, and is missing otherwise."""
import html
import json

import pandas as pd
import pytest

import headscope
from headscope.analysis import Analysis
from headscope.atomic import write_manifest
from headscope.loading.loader import Loaded
from headscope.report import render_html
from headscope.report.data import label_grid
from headscope.probes.kinds import CopyProbe, RepeatedProbe, TextProbe
from headscope.tables import LABEL_COLUMNS, SCORE_COLUMNS
from tests.support.planted import char_tokenizer
from tests.support.tiny import tiny_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PROBES = [TextProbe(n_examples=4, seq_len=24), RepeatedProbe(n_examples=4, repeat_len=6, repeats=3)]


def _assert_sites_are(frame, expected_module):
    """Every row's `site` names, in the model, the module `expected_module(layer)`."""
    assert frame.site.notna().all()
    for layer, site in zip(frame.layer, frame.site):
        assert site == expected_module(int(layer)), (layer, site)


@pytest.fixture(scope="module")
def gpt2_analysis(planted):
    return headscope.analyze(planted, detectors=["induction", "previous_token"], probes=PROBES, explorer_examples=0)


def test_the_scores_labels_and_ov_tables_name_each_heads_module(planted, gpt2_analysis):
    model = planted.model
    blocks = model.transformer.h

    def path_of(layer):
        found = [name for name, module in model.named_modules() if module is blocks[layer].attn]
        assert len(found) == 1
        return found[0]

    assert list(gpt2_analysis.scores.columns) == SCORE_COLUMNS + ["site"]
    assert list(gpt2_analysis.labels.columns) == LABEL_COLUMNS + ["site"]
    for frame in (gpt2_analysis.scores, gpt2_analysis.labels, gpt2_analysis.ov):
        _assert_sites_are(frame, path_of)
        assert all(model.get_submodule(site) is blocks[layer].attn for layer, site in zip(frame.layer, frame.site))
    hover = label_grid(gpt2_analysis).hover  # the report's label map names the module too
    assert all(f"<br>{path_of(layer)}<br>" in hover[layer][head] for layer in range(len(blocks)) for head in range(2))


def test_a_saved_analysis_keeps_its_sites_and_an_older_folder_still_loads(gpt2_analysis, tmp_path):
    folder = gpt2_analysis.save(tmp_path / "a")
    again = Analysis.load(folder)
    pd.testing.assert_frame_equal(again.scores, gpt2_analysis.scores, check_dtype=False)
    pd.testing.assert_series_equal(again.labels.site, gpt2_analysis.labels.site)
    # A folder written before the column: the CSVs without it, the manifest written again.
    for name in ("scores.csv", "labels.csv"):
        frame = pd.read_csv(folder / name, keep_default_na=False)
        frame.drop(columns="site").to_csv(folder / name, index=False)
    write_manifest(folder)
    old = Analysis.load(folder)
    assert old.scores.site.isna().all() and old.labels.site.isna().all()  # the default group's modules were not recorded
    assert "<br>transformer.h." not in "".join(h for row in label_grid(old).hover for h in row)  # nothing invented
    page = render_html(old, plotlyjs="cdn")  # the report of an older folder still renders
    assert html.escape(old.meta["model"]) in page and "hs-explorer-data" in page
    pd.testing.assert_frame_equal(old.scores.drop(columns="site"), gpt2_analysis.scores.drop(columns="site"),
                                  check_dtype=False)


@pytest.mark.parametrize("sites", ["decoder.self", "decoder.cross"])
def test_a_decoder_groups_tables_name_its_modules_and_old_folders_read_them_from_meta(sites, tmp_path):
    model = tiny_model("bart", kind="encoder_decoder")
    loaded = Loaded.from_model(model, char_tokenizer(), "tiny-bart")
    analysis = headscope.analyze(loaded, sites=sites, probes=PROBES + [CopyProbe(n_examples=4, seq_len=24)],
                                 explorer_examples=0)
    attribute = "self_attn" if sites == "decoder.self" else "encoder_attn"
    layers = model.model.decoder.layers

    def module(layer):
        return getattr(layers[layer], attribute)

    for frame in (analysis.scores, analysis.labels):
        assert frame.site.notna().all()
        assert all(model.get_submodule(site) is module(layer) for layer, site in zip(frame.layer, frame.site))
        assert set(frame.site) == {f"model.decoder.layers.{layer}.{attribute}" for layer in range(len(layers))}
    folder = analysis.save(tmp_path / "a")
    for name in ("scores.csv", "labels.csv"):
        frame = pd.read_csv(folder / name, keep_default_na=False)
        frame.drop(columns="site").to_csv(folder / name, index=False)
    write_manifest(folder)
    assert json.loads((folder / "meta.json").read_text())["sites"]["group"] == sites
    old = Analysis.load(folder)
    pd.testing.assert_series_equal(old.scores.site, analysis.scores.site)
    pd.testing.assert_series_equal(old.labels.site, analysis.labels.site)


def test_a_hybrids_sites_keep_the_models_layer_numbers():
    model = tiny_model("jamba", kind="hybrid")
    loaded = Loaded.from_model(model, char_tokenizer(), "tiny-jamba")
    analysis = headscope.analyze(loaded, detectors=["previous_token"], probes=PROBES[:1], explorer_examples=0,
                                 control=None)
    attending = sorted(set(analysis.scores.layer))
    assert attending == [i for i, layer in enumerate(model.model.layers) if hasattr(layer, "self_attn")]
    assert attending != list(range(len(attending)))  # numbered as the model numbers them, not 0..n-1
    for layer, site in zip(analysis.scores.layer, analysis.scores.site):
        assert model.get_submodule(site) is model.model.layers[int(layer)].self_attn


def test_the_geometry_heads_table_names_each_heads_module(planted):
    result = headscope.geometry(planted, n_examples=2, seq_len=16, importance=False)
    blocks = planted.model.transformer.h
    assert result.heads.site.notna().all()
    assert all(planted.model.get_submodule(site) is blocks[int(layer)].attn
               for layer, site in zip(result.heads.layer, result.heads.site))
