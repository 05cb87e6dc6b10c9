# SPDX-License-Identifier: Apache-2.0
"""The package's layering holds: no folder loops, no file loops inside a folder, no upward imports.

Every module of `vllm_omni_token2wav` is parsed with `ast` (nothing is imported). An import counts
wherever it sits: in a function (a lazy import is still a dependency) and under `if TYPE_CHECKING:` (an
annotation that names a higher layer is still a dependency of the reader). The layer order is the table in
docs/design/architecture.md ("Layers"): a folder may import its own layer and the ones below, never a
higher one; the families (the row that names them) never import each other. Loops are checked between
real folders (every package directory, a package and its own subpackages counted as one tree), not only
between table rows, so two parts of one row cannot lean on each other. A failure names the offending import
as `file:line  from -> to`.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "vllm_omni_token2wav"
ARCHITECTURE_DOC = REPO / "docs" / "design" / "architecture.md"

#: Program entry points: they import the command line and nothing imports them, so they sit above every layer.
ENTRY_POINTS = frozenset({f"{PACKAGE}.__main__"})

#: Folder loops tolerated for now: {frozenset of unit folders (Layers table spelling): reason}.
FOLDER_CYCLE_ALLOWLIST: dict[frozenset[str], str] = {}

#: Imports from a lower into a higher layer tolerated for now: {(from unit, to unit): reason}.
LAYER_ALLOWLIST: dict[tuple[str, str], str] = {}

#: File loops inside one folder tolerated: {frozenset of module names: reason}.
FILE_CYCLE_ALLOWLIST: dict[frozenset[str], str] = {
    frozenset({f"{PACKAGE}.platforms", f"{PACKAGE}.platforms.device"}): (
        "the package's `current_omni_platform` is a lazy PEP 562 attribute; device.py reads it at call time"
    ),
}


@dataclass(frozen=True)
class Import:
    """One import statement's target module, where it is written."""

    source: str
    target: str
    path: Path
    line: int

    def describe(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}  {self.source} -> {self.target}"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((REPO / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        if name not in ENTRY_POINTS:
            out[name] = path
    return out


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for child in ast.walk(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []
    for node in _import_nodes(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # `from pkg import sub` depends on pkg.sub when it is a module, else on pkg itself
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        for name in names:
            if not name.startswith(PACKAGE):
                continue
            target = _resolve(name, modules)
            if target is not None and target != module:
                found.append(Import(module, target, path, node.lineno))
    return found


def _folder(module: str, modules: dict[str, Path]) -> str:
    """The module's folder, relative to the package (`""` for the package root)."""
    folder = modules[module].parent.relative_to(REPO / PACKAGE).as_posix()
    return "" if folder == "." else folder


@dataclass(frozen=True)
class Layers:
    """The layer table of docs/design/architecture.md: folder -> layer number (subfolders inherit)."""

    rank: dict[str, int]
    names: dict[int, str]

    def unit(self, folder: str) -> str:
        """The longest listed folder containing `folder` (the unit the loop and layer checks use)."""
        best = None
        for listed in self.rank:
            # `./` is the root modules only: a folder that no row names is an error, not a root module
            if folder == listed or (listed != "" and folder.startswith(listed + "/")):
                if best is None or len(listed) > len(best):
                    best = listed
        if best is None:
            raise AssertionError(f"folder {PACKAGE}/{folder} is in no layer of {ARCHITECTURE_DOC.name}; add it")
        return best


def _layers() -> Layers:
    text = ARCHITECTURE_DOC.read_text(encoding="utf-8")
    section = text.split("\n## Layers", 1)
    assert len(section) == 2, f"{ARCHITECTURE_DOC}: no '## Layers' section"
    rank: dict[str, int] = {}
    names: dict[int, str] = {}
    for line in section[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].isdigit():
            continue
        number = int(cells[0])
        names[number] = cells[2]
        for folder in re.findall(r"`([^`]+)/`", cells[1]):
            folder = "" if folder == "." else folder
            assert folder not in rank, f"{ARCHITECTURE_DOC.name}: {folder}/ is listed twice"
            rank[folder] = number
    assert rank, f"{ARCHITECTURE_DOC}: the Layers table lists no folder"
    return Layers(rank, names)


def _cycles(nodes: set[str], edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(frozenset(component))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, Path], list[Import], Layers]:
    modules = _modules()
    imports = [imp for module, path in modules.items() for imp in _imports(module, path, modules)]
    return modules, imports, _layers()


def _show(folder: str) -> str:
    return f"{PACKAGE}/{folder}/" if folder else f"{PACKAGE}/ (root modules)"


def _nested(a: str, b: str) -> bool:
    return a == "" or b == "" or a.startswith(b + "/") or b.startswith(a + "/")


def _folder_cycles(
    graph: tuple[dict[str, Path], list[Import], Layers],
) -> tuple[list[frozenset[str]], dict[tuple[str, str], list[Import]]]:
    modules, imports, layers = graph
    edges: dict[str, set[str]] = defaultdict(set)
    witnesses: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for imp in imports:
        a, b = _folder(imp.source, modules), _folder(imp.target, modules)
        layers.unit(a), layers.unit(b)  # every folder sits in a row
        # a package and its own subpackages (`platforms/` and `platforms/cpu/`) are one family tree: edges
        # between unrelated folders only (siblings such as `layers/flow/` and `layers/hift/` included)
        if a != b and not _nested(a, b):
            edges[a].add(b)
            witnesses[(a, b)].append(imp)
    return _cycles(set(edges) | {b for bs in edges.values() for b in bs}, edges), witnesses


def _file_cycles(graph: tuple[dict[str, Path], list[Import], Layers]) -> list[frozenset[str]]:
    modules, imports, _ = graph
    edges: dict[str, set[str]] = defaultdict(set)
    for imp in imports:
        if _folder(imp.source, modules) == _folder(imp.target, modules):
            edges[imp.source].add(imp.target)
    return _cycles(set(modules), edges)


def test_no_loops_between_folders(graph: tuple[dict[str, Path], list[Import], Layers]) -> None:
    cycles, witnesses = _folder_cycles(graph)
    problems = []
    for cycle in cycles:
        if frozenset(cycle) in FOLDER_CYCLE_ALLOWLIST:
            continue
        lines = [f"folder loop between {', '.join(_show(f) for f in sorted(cycle))}:"]
        for (a, b), found in sorted(witnesses.items()):
            if a in cycle and b in cycle:
                lines += [f"    {imp.describe()}" for imp in found]
        problems.append("\n".join(lines))
    assert not problems, "\n".join(problems)


def test_no_loops_between_files_of_a_folder(graph: tuple[dict[str, Path], list[Import], Layers]) -> None:
    modules, imports, _ = graph
    problems = []
    for cycle in _file_cycles(graph):
        if frozenset(cycle) in FILE_CYCLE_ALLOWLIST:
            continue
        inside = [imp for imp in imports if imp.source in cycle and imp.target in cycle]
        problems.append(
            f"file loop in {_show(_folder(next(iter(cycle)), modules))}: {', '.join(sorted(cycle))}\n"
            + "\n".join(f"    {imp.describe()}" for imp in inside)
        )
    assert not problems, "\n".join(problems)


def test_no_import_from_a_higher_layer(graph: tuple[dict[str, Path], list[Import], Layers]) -> None:
    modules, imports, layers = graph
    problems = []
    for imp in imports:
        a, b = layers.unit(_folder(imp.source, modules)), layers.unit(_folder(imp.target, modules))
        if layers.rank[b] > layers.rank[a] and (a, b) not in LAYER_ALLOWLIST:
            problems.append(
                f"{imp.describe()}\n    layer {layers.rank[a]} ({layers.names[layers.rank[a]]}) imports layer "
                f"{layers.rank[b]} ({layers.names[layers.rank[b]]})"
            )
    assert not problems, "imports from a higher layer:\n" + "\n".join(problems)


def test_allowlists_name_only_existing_problems(graph: tuple[dict[str, Path], list[Import], Layers]) -> None:
    """An allowlist entry whose loop or upward import is gone must be removed, so the lists only shrink."""
    modules, imports, layers = graph
    folder_cycles, _ = _folder_cycles(graph)
    file_cycles = _file_cycles(graph)
    stale = [sorted(c) for c in FOLDER_CYCLE_ALLOWLIST if c not in folder_cycles]
    stale += [sorted(c) for c in FILE_CYCLE_ALLOWLIST if c not in file_cycles]
    upward = {(layers.unit(_folder(i.source, modules)), layers.unit(_folder(i.target, modules))) for i in imports}
    stale += [list(pair) for pair in LAYER_ALLOWLIST if pair not in upward]
    assert not stale, f"allowlist entries that no longer match a loop or an import; remove them: {stale}"


def _families(layers: Layers) -> set[str]:
    rows = [n for n, name in layers.names.items() if name.startswith("the families")]
    assert len(rows) == 1, f"{ARCHITECTURE_DOC.name}: one Layers row must start with 'the families', got {rows}"
    return {folder for folder, n in layers.rank.items() if n == rows[0]}


def test_families_are_siblings(graph: tuple[dict[str, Path], list[Import], Layers]) -> None:
    """No family imports another (lazily or for annotations either): what two families share is a part
    (`model_executor/layers/`) or the shared core, never one family's module."""
    modules, imports, layers = graph
    families = _families(layers)
    assert len(families) >= 3, families
    problems = []
    for imp in imports:
        a, b = layers.unit(_folder(imp.source, modules)), layers.unit(_folder(imp.target, modules))
        if a != b and a in families and b in families:
            problems.append(imp.describe())
    assert not problems, "a family imports another family:\n" + "\n".join(problems)


def test_every_folder_sits_in_a_row(graph: tuple[dict[str, Path], list[Import], Layers]) -> None:
    """A new folder must be placed in the Layers table (the root row `./` holds only the root modules)."""
    modules, _, layers = graph
    for module in modules:
        layers.unit(_folder(module, modules))
