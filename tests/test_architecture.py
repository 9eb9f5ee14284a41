"""The shape of the house (ARCHITECTURE.md): layers import only downwards, no import circles,
no name-prefixed families, and docs/architecture.md lists every module with its one line."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "atomic_ckpt"
TABLE = PACKAGE.parent / "docs" / "architecture.md"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(module: str, path: Path) -> set[str]:
    """The atomic_ckpt modules ``module`` imports (anywhere in it, TYPE_CHECKING included)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = module.split(".") if is_pkg else module.split(".")[:-1]
            if node.level:
                base = base[: len(base) - (node.level - 1)]
                src = ".".join([*base, *([node.module] if node.module else [])])
            else:
                src = node.module or ""
            targets = [
                f"{src}.{a.name}" if f"{src}.{a.name}" in MODULES else src for a in node.names
            ]
        else:
            continue
        out.update(t for t in targets if t in MODULES and t != module)
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def rank(module: str) -> int:
    """The layer of ``module``: 0 the version, 1-5 the core's folders, 5 the facade's
    re-exports, 6 the optional layers, 7 the command line."""
    if module == "atomic_ckpt._version":
        return 0
    layer = re.match(r"atomic_ckpt\._core\.l(\d)_", module)
    if layer:
        return int(layer.group(1))
    if module in ("atomic_ckpt", "atomic_ckpt._core") or module.startswith("atomic_ckpt._core"):
        return 5
    if module.startswith("atomic_ckpt.cli"):
        return 7
    return 6


def test_no_module_imports_from_a_layer_above_it() -> None:
    """Every import arrow points to the module's own layer or one below it."""
    upward = [f"{m} -> {t}" for m, ts in GRAPH.items() for t in ts if rank(t) > rank(m)]
    assert not upward, upward


def test_the_core_never_imports_the_package_face_or_an_optional_layer() -> None:
    """The core's modules import only each other (and the version): ``import atomic_ckpt``
    never pulls in torch, a framework or the command line."""
    core = [m for m in GRAPH if m.startswith("atomic_ckpt._core")]
    bad = [
        f"{m} -> {t}"
        for m in core
        for t in GRAPH[m]
        if not (t.startswith("atomic_ckpt._core") or t == "atomic_ckpt._version")
    ]
    assert not bad, bad


def test_there_are_no_import_circles() -> None:
    """The import graph of the package is acyclic (TYPE_CHECKING imports count too)."""
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for t in sorted(GRAPH[m]):
            if state.get(t) == 1:
                cycles.append([*stack[stack.index(t) :], t])
            elif t not in state:
                visit(t, [*stack, t])
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


def test_families_of_modules_are_packages_not_name_prefixes() -> None:
    """No two modules of one folder share a name prefix such as ``_dcp_`` or ``_cli_``."""
    by_folder: dict[Path, list[str]] = {}
    for path in MODULES.values():
        by_folder.setdefault(path.parent, []).append(path.stem.lstrip("_"))
    families = []
    for folder, stems in by_folder.items():
        prefixes = [s.split("_")[0] for s in stems if "_" in s]
        families += [f"{folder.name}/{p}_*" for p in set(prefixes) if prefixes.count(p) > 1]
    assert not families, families


def test_the_module_table_in_the_docs_matches_the_tree() -> None:
    """docs/architecture.md has one row per module, each with its docstring's first line."""
    rows = dict(re.findall(r"^\| `([^`]+)` \| (.*?) \|$", TABLE.read_text(), re.MULTILINE))
    expected = {str(path.relative_to(PACKAGE.parent)): _summary(path) for path in MODULES.values()}
    assert sorted(rows) == sorted(expected)
    assert rows == expected


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = doc.split("\n\n")[0].replace("\n", " ").strip()
    return first.replace("|", "\\|")


MAX_LINES = 450
GENERATED: frozenset[str] = frozenset()
"""Modules exempt from the size limit because a tool writes them (none today)."""


def test_no_module_is_over_450_lines() -> None:
    """Every module fits in 450 lines (ARCHITECTURE.md): a longer one is split along a seam a
    reader would name; generated modules, named above, are the only exception."""
    too_long = {
        module: n
        for module, path in MODULES.items()
        if module not in GENERATED and (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not too_long, f"modules over {MAX_LINES} lines: {too_long}"
