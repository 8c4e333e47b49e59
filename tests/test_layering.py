"""The package layout is the architecture: every import (module level, in functions, under TYPE_CHECKING)
points down the layers below, no module-level import cycle exists, and torch and transformers are imported
only by the measurement packages (bench/, validate/)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "zerocalc"

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
_layer("zerocalc", "api")  # the package's facade (__init__): lazy names from api and the results
_layer("render", "comm", "peak")  # the tables of results, shared by the CLI and the results' display
_layer("bench", "network", "harness", "compute")
_layer("validate", "bench", "comm", "peak", "api")
_layer("cli", "validate", "scenarios", "zerocalc", "render")
_layer("__main__", "cli")

DISPLAY_HOOK = ("zerocalc.base.display", "zerocalc.render.display")
"""The one import up the layers: the results' display mixin (in the core's vocabulary, so that result
models can inherit it) imports the renderers inside its methods, when a result is displayed, never at
module level."""
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


def _imports(path: Path, top_level_only: bool = False) -> set[str]:
    """Every zerocalc module or third-party top-level name ``path`` imports."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
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
        and (module, target) != DISPLAY_HOOK
    }
    assert not upward, f"{module} ({package}) imports {sorted(upward)} from a layer it may not use"


def test_the_display_hook_imports_the_renderers_only_when_called() -> None:
    module, target = DISPLAY_HOOK
    assert target in _imports(MODULES[module]), "the display hook is gone: remove DISPLAY_HOOK"
    assert target not in _imports(MODULES[module], top_level_only=True)
    assert not {t for t in _imports(MODULES[module], True) if t.startswith("zerocalc.render")}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_torch_only_in_measurement(module: str) -> None:
    if _package(module) in MEASUREMENT:
        return
    libraries = {t for t in _imports(MODULES[module]) if t.split(".")[0] in TORCH_LIBRARIES}
    assert not libraries, f"{module} imports {sorted(libraries)}: only bench/ and validate/ may"


def test_no_module_level_import_cycle() -> None:
    graph = {m: {t for t in _imports(p, True) if t in MODULES and t != m} for m, p in MODULES.items()}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, path: list[str]) -> bool:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle.extend([*path, node, nxt])
                return True
            if nxt not in state and visit(nxt, [*path, node]):
                return True
        state[node] = 2
        return False

    for module in sorted(graph):
        if module not in state and visit(module, []):
            break
    assert not cycle, " -> ".join(cycle)


def test_the_layering_test_sees_an_upward_import(tmp_path: Path) -> None:
    """The check itself fails on a core module importing the CLI (so the tests above can fail)."""
    bad = tmp_path / "bad.py"
    bad.write_text("from zerocalc.cli.render import print_json\nimport torch\n")
    targets = _imports(bad)
    assert "zerocalc.cli.render" in targets and "torch" in targets
    assert _package("zerocalc.cli.render") not in BELOW["states"]
