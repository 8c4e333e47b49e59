"""The package layout is the architecture: every import (module level, in functions, under TYPE_CHECKING)
points down the layers below, no import cycle exists (not even one closed by an import inside a function),
and torch and transformers are imported only by the measurement packages (bench/, validate/)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers import ROOT

PACKAGE = ROOT / "zerocalc"

BELOW: dict[str, set[str]] = {}
"""What each package may import, besides itself (filled below, layer by layer)."""


def _layer(name: str, *deps: str) -> None:
    BELOW[name] = set(deps).union(*(BELOW[d] for d in deps))


_layer("base")
_layer("model", "base")
_layer("network", "base")
_layer("harness", "base")
_layer("parallel", "model", "network")
_layer("compute", "parallel")
_layer("request", "parallel", "compute")
_layer("states", "request")
_layer("comm", "states")
_layer("peak", "states")
_layer("plan", "comm", "peak")
_layer("scenarios", "plan")
_layer("api", "plan")  # plan() is the search; plan may import comm and peak
_layer("render", "plan")  # the tables and figures of results, shared by the CLI and the display
_layer("zerocalc", "api", "render")  # the facade (__init__): lazy names, the results' renderers wired in
_layer("bench", "network", "harness", "compute")
_layer("validate", "bench", "comm", "peak", "api")
_layer("cli", "validate", "scenarios", "zerocalc", "render")
_layer("__main__", "cli")

MEASUREMENT = {"bench", "validate"}
TORCH_LIBRARIES = ("torch", "transformers", "numpy")


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _package(module: str) -> str:
    parts = module.split(".")
    return "zerocalc" if len(parts) == 1 else parts[1]


def _type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): its body never runs."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _run_time_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` that can run: all but the bodies of ``if TYPE_CHECKING:`` blocks."""
    found: list[ast.AST] = []
    pending = [tree]
    while pending:
        node = pending.pop()
        found.append(node)
        if _type_checking(node):
            assert isinstance(node, ast.If)
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))
    return found


def _imports(path: Path, top_level_only: bool = False, run_time_only: bool = False) -> set[str]:
    """Every zerocalc module or third-party top-level name ``path`` imports (``run_time_only``: those an
    import statement that can run names, wherever it is, so not under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text())
    if top_level_only:
        nodes: list[ast.AST] = list(tree.body)
    elif run_time_only:
        nodes = _run_time_nodes(tree)
    else:
        nodes = list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                found.add(dotted if dotted in MODULES else node.module)
    return found


def test_every_package_has_a_layer() -> None:
    assert {_package(m) for m in MODULES} <= set(BELOW), "a new package needs its place in BELOW"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_layers(module: str) -> None:
    package = _package(module)
    upward = {
        target
        for target in _imports(MODULES[module])
        if target.split(".")[0] == "zerocalc"
        and _package(target) != package
        and _package(target) not in BELOW[package]
    }
    assert not upward, f"{module} ({package}) imports {sorted(upward)} from a layer it may not use"


def test_the_facade_loads_the_renderers_only_when_a_result_is_displayed() -> None:
    """``zerocalc/__init__.py`` wires the renderers into the results' display inside a function, so that
    ``import zerocalc`` (and every start-up) imports nothing of the rendering."""
    assert "zerocalc.render.display" in _imports(MODULES["zerocalc"])
    assert not {t for t in _imports(MODULES["zerocalc"], True) if t.startswith("zerocalc.render")}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_torch_only_in_measurement(module: str) -> None:
    if _package(module) in MEASUREMENT:
        return
    libraries = {t for t in _imports(MODULES[module]) if t.split(".")[0] in TORCH_LIBRARIES}
    assert not libraries, f"{module} imports {sorted(libraries)}: only bench/ and validate/ may"


Graph = dict[str, set[str]]


def _graph(top_level_only: bool = False) -> Graph:
    """Module → the zerocalc modules it imports: at module level only, or wherever an import can run."""
    return {
        m: {t for t in _imports(p, top_level_only, run_time_only=True) if t in MODULES and t != m}
        for m, p in MODULES.items()
    }


def _cycles(graph: Graph) -> list[list[str]]:
    """One import cycle (``a → b → … → a``) per strongly connected group of modules in ``graph``, or none."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(node: str) -> None:  # Tarjan's strongly connected components
        order[node] = low[node] = len(order)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in order:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            group: set[str] = set()
            while node not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in order:
            connect(node)
    cycles = []
    for group in groups:
        start = min(group)
        paths, seen = [[start]], {start}
        while paths:  # breadth first, inside the group: the shortest way from start back to it
            path = paths.pop(0)
            targets = sorted(graph[path[-1]] & group)
            if start in targets:
                cycles.append([*path, start])
                break
            for nxt in targets:
                if nxt not in seen:
                    seen.add(nxt)
                    paths.append([*path, nxt])
    return sorted(cycles)


def _reaches(graph: Graph, start: str, goal: str) -> bool:
    """Whether ``start`` imports ``goal``, directly or through other modules."""
    seen, pending = {start}, [start]
    while pending:
        for nxt in graph.get(pending.pop(), ()):
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                pending.append(nxt)
    return False


def _without(graph: Graph, imports: set[tuple[str, str]]) -> Graph:
    return {m: {t for t in targets if (m, t) not in imports} for m, targets in graph.items()}


def test_no_module_level_import_cycle() -> None:
    cycles = _cycles(_graph(top_level_only=True))
    assert not cycles, "\n".join(" -> ".join(cycle) for cycle in cycles)


CYCLES_BEING_REMOVED: dict[tuple[str, str], str] = {}
"""The imports that close the import cycles still in the code, each closed inside a function. They are
being removed (issue 39, the lead's part): delete an entry with its cycle; nothing else may be added."""


def test_no_import_cycle_even_through_imports_inside_functions() -> None:
    """No cycle in the graph of every import that can run (module level and inside functions; not
    ``if TYPE_CHECKING:``), but the ones :data:`CYCLES_BEING_REMOVED` names."""
    cycles = _cycles(_without(_graph(), set(CYCLES_BEING_REMOVED)))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


@pytest.mark.parametrize("allowed", sorted(CYCLES_BEING_REMOVED), ids=" -> ".join)
def test_every_allowed_cycle_still_exists(allowed: tuple[str, str]) -> None:
    """An entry of :data:`CYCLES_BEING_REMOVED` whose cycle is gone is deleted, so the list only shrinks."""
    module, target = allowed
    graph = _graph()
    assert target in graph[module], f"{module} no longer imports {target}: delete its entry"
    assert _reaches(graph, target, module), f"{module} → {target} closes no cycle any more: delete its entry"


def test_the_cycle_check_sees_a_cycle_closed_inside_a_function(tmp_path: Path) -> None:
    """The graph counts an import inside a function, not one under ``if TYPE_CHECKING:``, and the cycle
    finder names the cycle."""
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from zerocalc.base import units\n"
        "def f():\n    from zerocalc.base import errors\n"
    )
    assert _imports(module, run_time_only=True) == {"typing", "zerocalc.base.errors"}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert _reaches({"a": {"b"}, "b": {"c"}, "c": set()}, "a", "c") and not _reaches({"a": set()}, "a", "b")


def test_the_layering_test_sees_an_upward_import(tmp_path: Path) -> None:
    """The check itself fails on a core module importing the CLI (so the tests above can fail)."""
    bad = tmp_path / "bad.py"
    bad.write_text("from zerocalc.cli.render import print_json\nimport torch\n")
    targets = _imports(bad)
    assert "zerocalc.cli.render" in targets and "torch" in targets
    assert _package("zerocalc.cli.render") not in BELOW["states"]


def test_tests_import_their_shared_code_as_helpers() -> None:
    """``tests`` is no package: pytest puts ``tests/`` on the path (``pythonpath``), so shared code is
    ``helpers``; ``from tests.helpers import ...`` works only where the repository root happens to be on
    the path, and fails collection in a clean checkout."""
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            if any(name == "tests" or name.startswith("tests.") for name in names):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders
