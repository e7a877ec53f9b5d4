"""The package's layers, read from its source: which module imports which, and that nothing goes the wrong way.

collect -> record <- render; metrics declare fields and never render; no import cycle; lazy (function-level)
imports only for optional or heavy third-party packages, never to dodge a cycle; private torch APIs in _torch.py.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "layerprof"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        parts = module.split(".")
        if not is_package:
            parts.pop()
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    if node.module is None:  # from . import a, b: the submodules
        return [f"{base}.{alias.name}" for alias in node.names]
    return [base]


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """(module-level imports, imports inside functions) of one file, as absolute names; TYPE_CHECKING skipped."""
    module = _module_name(path)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top: set[str] = set()
    nested: set[str] = set()

    def visit(node: ast.AST, inside_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            target = nested if inside_function else top
            if isinstance(child, ast.Import):
                target.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                target.update(_resolve(module, is_package, child))
            visit(child, inside_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, False)
    return top, nested


FILES = sorted(PACKAGE.rglob("*.py"))
IMPORTS = {_module_name(path): _imports(path) for path in FILES}
MODULES = set(IMPORTS)


def _internal(names: set[str]) -> set[str]:
    """The layerprof modules named (``layerprof.record.records.ModuleRecord`` counts as its module)."""
    found = set()
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name.startswith("layerprof"):
            found.add(name)
    return found


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


# What each layer may not import (directly, at any level of nesting).
FORBIDDEN = {
    "record": {"collect", "render", "metrics", "distributed", "cli", "integrations", "profile", "benchmark"},
    "metrics": {"collect", "render", "distributed", "cli", "integrations", "profile", "benchmark"},
    "render": {"collect", "metrics", "distributed", "cli", "integrations", "benchmark"},
    "collect": {"render", "distributed", "cli", "integrations"},
    "distributed": {"collect", "cli", "integrations"},
    "plan": {"distributed", "cli", "integrations", "benchmark"},
}


def test_the_package_is_read() -> None:
    assert {"layerprof.collect.profiler", "layerprof.record.fields", "layerprof.render.summary"} <= MODULES
    assert "layerprof.record.records" in _internal(IMPORTS["layerprof.render.summary"][0])


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _layer(m) in FORBIDDEN))
def test_no_layer_imports_one_it_must_not(module: str) -> None:
    top, nested = IMPORTS[module]
    wrong = sorted(m for m in _internal(top | nested) if _layer(m) in FORBIDDEN[_layer(module)])
    assert not wrong, f"{module} imports {wrong}"


def test_render_reads_records_but_not_their_files() -> None:
    for module in MODULES:
        if _layer(module) == "render":
            top, nested = IMPORTS[module]
            assert "layerprof.record.io" not in _internal(top | nested), module


def test_lazy_imports_are_for_third_party_packages_only() -> None:
    lazy = {module: sorted(_internal(IMPORTS[module][1])) for module in MODULES}
    assert {module: names for module, names in lazy.items() if names} == {}


def test_no_import_cycle() -> None:
    graph = {module: _internal(IMPORTS[module][0]) - {module} for module in MODULES}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_private_torch_apis_live_in_one_file() -> None:
    private = (r"torch\._C", r"torch\.utils\._", r"\._sequence_nr\(", r"\w\._version\b", r"\._cdata",
               r"\._nested_tensor_size\(", r"torch\._dynamo")
    for path in FILES:
        if path.name == "_torch.py":
            continue
        text = path.read_text(encoding="utf-8")
        used = [marker for marker in private if re.search(marker, text)]
        assert not used, f"{path.relative_to(PACKAGE.parent)} uses {used}: move it to layerprof/_torch.py"
