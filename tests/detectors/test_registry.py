"""The registry: built-ins listed in `BUILTINS`, imported when it is first read, never by
importing `headscope.detectors`; a built-in's report section read without its detector is the
one its detector carries."""
import subprocess
import sys

from headscope.detectors import REGISTRY, induction
from headscope.detectors.protocol import Detector
from headscope.detectors.registry import BUILTINS, report_section


def test_the_registry_holds_the_builtins_in_their_listed_order():
    assert list(REGISTRY)[:len(BUILTINS)] == [builtin.name for builtin in BUILTINS]
    assert REGISTRY["induction"] is induction and isinstance(induction, Detector)


def test_a_builtins_section_is_the_one_its_detector_carries():
    for builtin in BUILTINS:
        assert report_section(builtin.name) is REGISTRY[builtin.name].report
        assert (builtin.section is None) == (REGISTRY[builtin.name].report is None)


def test_importing_the_package_registers_nothing_until_the_registry_is_read():
    script = ("import sys\nimport headscope.detectors as d\nfrom headscope.detectors.registry import REGISTRY\n"
              "print(REGISTRY.loaded, 'headscope.detectors.patterns.induction' in sys.modules)\n"
              "names = list(d.REGISTRY)\nprint(REGISTRY.loaded, len(names))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "True", str(len(BUILTINS))]
