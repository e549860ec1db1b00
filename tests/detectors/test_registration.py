"""A custom detector is checked when it is made and registered: a bad field is a one-line
HeadscopeError naming the detector and the field, never a failure inside `analyze` or the
report; a built-in is replaced only with `replace=True`."""
import dataclasses

import pytest
import torch

import headscope
from headscope.detectors import REGISTRY, induction
from headscope.detectors.protocol import Detector
from headscope.detectors.registry import register
from headscope.errors import HeadscopeError


def diagonal(tokens):
    return torch.eye(len(tokens), dtype=torch.bool)


def _fields(**changes):
    base = dict(name="checked_here", probe="text", threshold=0.5, formula="f", source="this test",
                fn=lambda pattern, batch: None)
    return {**base, **changes}


@pytest.mark.parametrize("changes, fragment", [
    (dict(name=""), "a detector name must be"),
    (dict(name="a:b"), "a detector name must be"),
    (dict(name=" padded"), "a detector name must be"),
    (dict(name=5), "a detector name must be"),
    (dict(probe="nope"), "unknown probe 'nope'; use one of text, repeated, treebank, needle"),
    (dict(threshold="high"), "threshold must be a finite number"),
    (dict(threshold=float("nan")), "threshold must be a finite number"),
    (dict(threshold=True), "threshold must be a finite number"),
    (dict(fn=5), "fn must be a function"),
    (dict(run="later"), "run must be a function or None"),
    (dict(gate="mean"), "gate must be one of score, ci_low"),
    (dict(formula=None), "formula must be a string"),
    (dict(variants=["a"]), "variants must be a tuple"),
    (dict(short=""), "short must be a non-empty string"),
    (dict(colour="notacolour"), "colour 'notacolour' is not a colour"),
    (dict(report_rule=("only a topic",)), "report_rule must be ()"),
    (dict(report="section"), "report must be a ReportSection"),
])
def test_a_bad_field_is_refused_when_the_detector_is_made(changes, fragment):
    with pytest.raises(HeadscopeError, match="^" + ("" if "name" in changes else "detector 'checked_here': ")) as err:
        Detector(**_fields(**changes))
    assert fragment in str(err.value) and "\n" not in str(err.value)
    assert "checked_here" not in REGISTRY.so_far()


def test_good_colours_pass():
    for colour in ("teal", "#1f77b4", "#abc", "rgb(31, 119, 180)", "rgba(1, 2, 3, 0.5)"):
        assert Detector(**_fields(colour=colour)).colour == colour


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(template=5), "template must be a function"),
    (dict(template=diagonal, probe="treebank"), "a template detector reads the text or repeated probe"),
    (dict(template=diagonal, probe="nope"), "got probe='nope'"),
    (dict(template=diagonal, threshold=0), "threshold is an attention mass, so it must be in (0, 1]"),
    (dict(template=diagonal, threshold=1.5), "must be in (0, 1]"),
    (dict(template=diagonal, colour="notacolour"), "is not a colour"),
])
def test_template_detectors_are_checked(kwargs, fragment):
    with pytest.raises(HeadscopeError) as err:
        headscope.detector("checked_template", **kwargs)
    assert fragment in str(err.value)
    assert "checked_template" not in REGISTRY.so_far()


def test_a_builtin_is_replaced_only_when_asked():
    with pytest.raises(HeadscopeError, match="'induction' is a built-in detector; choose another name, or pass replace=True"):
        headscope.detector("induction", template=diagonal)
    assert REGISTRY["induction"] is induction
    with pytest.raises(HeadscopeError, match="built-in"):
        register(dataclasses.replace(induction, threshold=0.9))
    assert REGISTRY["induction"] is induction
    assert register(induction) is induction  # the built-in itself again is no replacement
    try:
        mine = headscope.detector("induction", template=diagonal, replace=True)
        assert REGISTRY["induction"] is mine
    finally:
        REGISTRY["induction"] = induction  # the registry is global: put the built-in back
    assert REGISTRY["induction"] is induction


def test_a_custom_detector_registered_again_replaces_the_earlier_one():
    try:
        first = headscope.detector("rerun_cell", template=diagonal)
        second = headscope.detector("rerun_cell", template=diagonal, threshold=0.7)
        assert REGISTRY["rerun_cell"] is second is not first
    finally:
        del REGISTRY["rerun_cell"]


def test_register_wants_a_detector():
    with pytest.raises(HeadscopeError, match="register needs a Detector"):
        register(type("NotADetector", (), {"name": "fake"})())
