"""docs/architecture.md cannot drift from the package layout: its list of every package's modules
names exactly the modules and subpackages in the folders, and its picture names every package."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "headscope"
PAGE = ROOT / "docs" / "architecture.md"


def _layout() -> dict[str, set[str]]:
    """Package -> its modules (`name`) and subpackages (`name/`), `__init__` aside."""
    return {package.name: {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
            | {f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").is_file()}
            for package in sorted(PACKAGE.iterdir()) if (package / "__init__.py").is_file()}


def _without_asides(text: str) -> str:
    """The text less its parenthesised asides (nested too) and its `code` spans."""
    text = re.sub(r"`[^`]*`", "", text)
    while re.search(r"\([^()]*\)", text):
        text = re.sub(r"\([^()]*\)", "", text)
    return text


def _documented(page: str) -> dict[str, set[str]]:
    """Package -> the module names its entry of "The modules of each package" lists."""
    section = page.split("## The modules of each package", 1)[1].split("\n## ", 1)[0]
    entries = re.findall(r"^- `(\w+)/`: (.*?)(?=^- |^\s*$)", section, re.M | re.S)
    listed = {}
    for package, text in entries:
        text = _without_asides(" ".join(text.split()))
        text = text.split(". ", 1)[0]  # the list ends at the first full stop; a note may follow
        names = [name.strip().rstrip(".").strip() for name in re.split(r",|;|\band\b", text)]
        listed[package] = {name for name in names if name}
    return listed


def test_every_package_lists_exactly_its_modules():
    page = PAGE.read_text(encoding="utf-8")
    documented, layout = _documented(page), _layout()
    assert set(documented) == set(layout), "packages on the page and in headscope/ differ"
    for package, modules in layout.items():
        assert documented[package] == modules, (
            f"{package}/: missing from docs/architecture.md {sorted(modules - documented[package])}, "
            f"listed but absent {sorted(documented[package] - modules)}")


def test_the_picture_names_every_package_and_the_top_level_modules_are_listed():
    page = PAGE.read_text(encoding="utf-8")
    picture = page.split("```", 2)[1]
    assert {name for name in _layout()} <= set(re.findall(r"(\w+)/", picture))
    top = page.split("At the top of `headscope/` only:", 1)[1].split("\n\n", 1)[0]
    assert set(re.findall(r"`(\w+)`", top)) >= {p.stem for p in PACKAGE.glob("*.py")}


def test_the_check_sees_a_missing_module(tmp_path):
    page = PAGE.read_text(encoding="utf-8").replace("- `kv/`: policy, formats, evaluate, report.",
                                                    "- `kv/`: policy, formats, evaluate.")
    assert _documented(page)["kv"] == _layout()["kv"] - {"report"}
