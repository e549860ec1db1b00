"""headscope's own modules form no import cycle, and import each other at the top.

The graph: one node per module under headscope/ (a package is its `__init__`). An edge A -> B
for every import of B in A's source, at module level *and* inside functions (a function-level
import only delays a cycle to the first call; it does not remove it). Importing
`headscope.x.y` also runs `headscope/x/__init__.py` first, so it counts as an edge to `x` too:
a package's re-exports are part of what importing any of its submodules costs. The exceptions
follow Python's own semantics: a module's enclosing packages are not counted (they are already
being imported when it runs), and `from pkg import name` counts an edge to `pkg.name` only when
that is a module. `headscope/__init__.py` re-exports lazily (`__getattr__` + `import_module`),
so it imports nothing and cannot close a cycle.
"""
import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "headscope"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, known) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import of a headscope module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in known]
        else:
            continue
        for target in targets:
            if target == "headscope" or target.startswith("headscope."):
                found.append((target, node.lineno, id(node) in in_function))
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        enclosing = {".".join(name.split(".")[:i]) for i in range(1, len(name.split(".")) + 1)}
        for target, _, _ in _imports(name, path, modules):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):  # the packages on the way, and the module itself
                step = ".".join(parts[:i])
                if step in modules and step not in enclosing:
                    graph[name].add(step)
    return graph


def _cycle(graph: dict[str, set[str]]):
    """One cycle as a list of modules, or None (depth-first search, colours white/grey/black)."""
    colour, stack = {}, []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(node):
        colour[node] = "grey"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if colour.get(nxt) == "grey":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in colour and (found := visit(nxt)):
                return found
        colour[node] = "black"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in colour and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_inside_headscope():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_check_finds_a_cycle_hidden_in_a_function():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_sees_function_level_and_package_edges():
    graph = _graph()
    assert "headscope.hf.verify" in graph["headscope.cli.models"]  # imported inside a command
    assert "headscope.detectors" not in graph["headscope.detectors.protocol"]  # its own package: not counted
    assert "headscope.detectors.runner" in graph["headscope.detectors.syntax.standalone"]
    assert "headscope.detectors.registry" in graph["headscope.detectors.protocol"]


# Own modules imported inside functions: the CLI's verify, analyze, geometry and timeline
# commands import the torch-heavy modules they run only when they run. Anything else goes
# at the top; the CLI reaches the rest of the engine through headscope's lazy public API.
MAX_DEFERRED = 5
# The entry point imports the command line inside main() on purpose, after installing the
# interrupt handler (headscope.atomic.exit_on_interrupt): that order is its whole job, not a
# dodged cycle. Only this one import is left out of the count.
ENTRY = ("headscope.__main__", "headscope.cli")


def _deferred() -> list[str]:
    modules = _modules()
    return [f"{name} -> {target} (line {line})" for name, path in sorted(modules.items())
            for target, line, inside in _imports(name, path, modules) if inside and (name, target) != ENTRY]


def test_at_most_five_own_imports_inside_functions():
    late = _deferred()
    assert len(late) <= MAX_DEFERRED, "own modules imported inside functions:\n" + "\n".join(late)


def test_top_level_holds_at_most_ten_modules():
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= 10, loose
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert {"attention", "loading", "probes", "detectors", "analysis", "head_geometry", "causal", "report",
            "hf"} <= set(packages)


# Packages whose purpose is one built-in detector's output: KV-cache policies rank heads by
# retrieval (or induction and duplicate-token) scores and are evaluated on needle prompts; the
# training timeline's phase change is the induction head's. They consume those names by design.
CONSUMERS = ("kv", "training")
SPECIFIC_MODULES = ("detectors.retrieval", "detectors.syntax", "detectors.patterns", "probes.needle",
                    "probes.treebank", "probes.conllu", "probes.arcs", "probes.align")
PROBE_CLASSES = {"TextProbe", "RepeatedProbe", "TreebankProbe", "NeedleProbe"}


def _builtin_names() -> set[str]:
    """Built-in detector and probe names, less the words attention sites use too ("self" is a
    detector and a site kind, "text" a probe and a stack): a string cannot say which it means."""
    from headscope.detectors.registry import REGISTRY
    from headscope.hf.sites import KINDS, STACKS
    from headscope.probes.kinds import PROBE_KINDS

    return (set(REGISTRY) | set(PROBE_KINDS)) - set(KINDS) - set(STACKS)


def _lines_naming_builtins(path: Path, names: set[str]) -> set[int]:
    """Code lines (docstrings and comments aside) with a string that is a built-in detector or
    probe name (or "name:qualifier"), an import of a detector's or probe kind's own module, or
    a probe kind's class; dict keys (plotly's "text") and CLI option help do not count."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {id(key) for node in ast.walk(tree) if isinstance(node, ast.Dict) for key in node.keys if key is not None}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skipped.add(id(first.value))  # docstring
        if isinstance(node, ast.keyword) and node.arg == "help":
            skipped |= {id(n) for n in ast.walk(node.value)}
        if isinstance(node, ast.JoinedStr):
            skipped |= {id(n) for n in ast.walk(node)}
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            if node.value in names or node.value.split(":")[0] in names:
                lines.add(node.lineno)
        elif isinstance(node, ast.ImportFrom) and any(m in (node.module or "") for m in SPECIFIC_MODULES):
            lines.add(node.lineno)
        elif isinstance(node, (ast.ImportFrom, ast.Import)) and {a.name for a in node.names} & PROBE_CLASSES:
            lines.add(node.lineno)
        elif isinstance(node, ast.Name) and node.id in PROBE_CLASSES:
            lines.add(node.lineno)
    return lines


def test_few_code_lines_outside_detectors_and_probes_name_a_builtin():
    names = _builtin_names()
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        part = path.relative_to(PACKAGE).parts[0]
        if part in ("detectors", "probes") + CONSUMERS:
            continue
        found += [f"{path.relative_to(PACKAGE)}:{line}" for line in sorted(_lines_naming_builtins(path, names))]
    assert len(found) <= 20, "\n".join(found)
    assert _lines_naming_builtins(PACKAGE / "training" / "toy.py", names), "the check finds names where they are"


def test_attention_imports_nothing_from_hf_at_module_level():
    """attention/ is the floor: hf/ builds on it. `MultiHeadAttention.from_hf` is the one name of
    attention/ that reads a Hugging Face block, and it imports `hf.from_hf` only when called."""
    modules = _modules()
    reaches = [(name, target, inside) for name, path in sorted(modules.items()) if name.startswith("headscope.attention")
               for target, _, inside in _imports(name, path, modules) if target.startswith("headscope.hf")]
    assert [(name, target) for name, target, inside in reaches if not inside] == []
    assert reaches == [("headscope.attention.module", "headscope.hf.from_hf", True)]
