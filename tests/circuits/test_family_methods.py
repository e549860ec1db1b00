"""The family table's circuit columns, measured: every method runs on each family's tiny model
where the table says yes (and EAP's patched runs are exact: the full circuit reproduces the clean
run and the empty one the corrupted run, and circuits run side by side in one pass measure what
they measure one a pass), and is refused in one line with the table's reason
where it says no (`headscope.hf.family_methods`)."""
import re

import pytest
import torch

from headscope.circuits.attribution import attribute
from headscope.circuits.edge_circuit import circuit
from headscope.circuits.composition_scores import composition
from headscope.circuits.dla import logit_attribution
from headscope.circuits.target import Target, output_logits
from headscope.errors import HeadscopeError
from headscope.hf.families import OTHER, family_table
from headscope.hf.family_methods import METHODS, REASONS, REFUSED, methods_of
from headscope.loading.loader import Loaded

from tests.support.circuit_models import random_task
from tests.support.tiny import (COMPOSITE_FAMILIES, ENCODER_DECODER_FAMILIES, ENCODERS, HYBRID_FAMILIES,
                                INTERFACE_FAMILIES, TEXT_DECODERS, tiny_config, tiny_decoder_alone, tiny_mllama,
                                tiny_model)

ROWS = [r.model_type for r in family_table() if r.capture and r.model_type != OTHER]
# Text decoders that only exist inside a vision-language model are measured through it.
MEASURED = [f for f in ROWS if f not in TEXT_DECODERS]


def _model(family: str):
    import transformers as tf

    if family in ENCODER_DECODER_FAMILIES:
        return tiny_model(family, kind="encoder_decoder")
    if family in HYBRID_FAMILIES:
        return tiny_model(family, kind="hybrid")
    if family in COMPOSITE_FAMILIES:
        return tiny_model(family, kind="composite")
    if family in ("mllama", "mllama_text_model"):
        return tiny_mllama(full=family == "mllama")
    if family == "bart_causal_lm":
        return tiny_decoder_alone()
    torch.manual_seed(0)
    assert family in INTERFACE_FAMILIES, family
    config = tiny_config(family, "interface")
    cls = tf.AutoModelForMaskedLM if family in ENCODERS else tf.AutoModelForCausalLM
    return cls.from_config(config).eval()


def _plain_metric(model, task, which: str) -> float:
    target = Target(model, task)
    inputs, _ = target.inputs(task, which)
    with torch.no_grad():
        logits = output_logits(model(**inputs, use_cache=False))
    return float(task.score(target.aligned(logits).float()).mean())


def _runs(method: str, loaded, task):
    if method == "dla":
        table = logit_attribution(loaded, task, n_resamples=10)
        assert len(table) and table.effect.notna().all()
    elif method == "atp":
        table = attribute(loaded, task, method="atp", n_resamples=10)
        assert len(table) and table.effect.notna().all()
    elif method == "eap":
        found = circuit(loaded, task, method="eap")
        table = found.evaluate(sizes=[50, 100], n_random=0, batch_size=task.n)
        scale = max(1.0, abs(table.attrs["clean_metric"]))
        assert table.attrs["clean_metric"] == pytest.approx(_plain_metric(loaded.model, task, "clean"), abs=1e-4 * scale)
        assert table.attrs["corrupted_metric"] == pytest.approx(_plain_metric(loaded.model, task, "corrupted"),
                                                                abs=1e-4 * scale)
        assert float(table.faithfulness.iloc[-1]) == pytest.approx(1.0, abs=1e-4)
        metrics = table[["metric", "metric_abs"]].to_numpy().copy()
        together = found.evaluate(sizes=[50, 100], n_random=0, batch_size=3 * task.n)  # the circuits in one pass
        assert together[["metric", "metric_abs"]].to_numpy() == pytest.approx(metrics, rel=1e-4, abs=1e-4 * scale)
    else:
        table = composition(loaded, kind="k", baseline_samples=10)
        assert len(table) and table.score.notna().all()


@pytest.mark.slow
@pytest.mark.parametrize("family", MEASURED)
def test_each_method_runs_or_is_refused_with_the_tables_reason(family):
    loaded = Loaded.from_model(_model(family), None, name=family)
    task = random_task(seed=0, n=3, length=7)
    for method, reason in methods_of(family).items():
        if reason is None:
            _runs(method, loaded, task)
        else:
            with pytest.raises(HeadscopeError, match=re.escape(REASONS[reason].phrase)):
                _runs(method, loaded, task)


def test_text_decoders_inside_a_vision_language_model_share_its_row():
    for text, whole in TEXT_DECODERS.items():
        assert methods_of(text) == methods_of(whole), text


def test_the_docs_state_the_tables_counts():
    from pathlib import Path

    from headscope.hf.families import method_counts

    assert method_counts() in (Path(__file__).resolve().parents[2] / "docs" / "circuits.md").read_text()


def test_refusals_name_families_of_the_table_and_known_reasons():
    assert set(REFUSED) <= set(ROWS)
    assert all(set(methods) <= set(METHODS) and set(methods.values()) <= set(REASONS) for methods in REFUSED.values())
