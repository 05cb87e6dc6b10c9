# SPDX-License-Identifier: Apache-2.0
"""The package's shape in numbers, for an architecture change's before -> after (issue 31's closing figures).

    python tools/architecture_figures.py            # the working tree
    python tools/architecture_figures.py --rev REV  # a commit, read through git (nothing checked out)
    python tools/architecture_figures.py --json     # the same as JSON

Figures: lines of `vllm_omni_token2wav/` by folder (model folders one level deeper), the largest classes, the
source files of each family, and the imports that cross families or run from shared code into a family
(lazy and `TYPE_CHECKING` imports included, as tests/test_architecture.py counts them). A family is a folder
of `model_executor/models/` holding a `family.py`; shared code is every other folder below the families in
docs/design/architecture.md's Layers table (parts, core, stage framework, platforms); `standin/` and the
layers above it (plugin, benchmarks, command line) may import families.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

PACKAGE = "vllm_omni_token2wav"
MODELS = f"{PACKAGE}/model_executor/models/"
#: Folders allowed to import a family: the stand-ins and everything above them.
ABOVE_FAMILIES = ("model_executor/models/standin", "plugins", "patch", "deploy", "benchmarks", "entrypoints", "tools")


@dataclass
class Figures:
    rev: str
    total_lines: int = 0
    lines_by_folder: dict[str, int] = field(default_factory=dict)
    largest_classes: list[tuple[int, str]] = field(default_factory=list)
    files_per_family: dict[str, int] = field(default_factory=dict)
    family_to_family: list[str] = field(default_factory=list)
    shared_to_family: list[str] = field(default_factory=list)


def _sources(rev: str | None, root: Path) -> dict[str, str]:
    """`{repo path: text}` of the package's Python files at `rev` (None: the working tree)."""
    if rev is None:
        return {p.relative_to(root).as_posix(): p.read_text() for p in sorted((root / PACKAGE).rglob("*.py"))}
    listing = ["git", "ls-tree", "-r", "--name-only", rev, "--", PACKAGE]
    names = subprocess.run(listing, cwd=root, check=True, capture_output=True, text=True).stdout.split()
    out = {}
    for name in names:
        if name.endswith(".py"):
            out[name] = subprocess.run(
                ["git", "show", f"{rev}:{name}"], cwd=root, check=True, capture_output=True, text=True
            ).stdout
    return out


def _folder_key(path: str) -> str:
    parts = path.split("/")[1:-1]  # below the package, without the file name
    if not parts:
        return "./"
    depth = 3 if parts[0] == "model_executor" and len(parts) >= 3 else 2 if parts[0] == "model_executor" else 1
    return "/".join(parts[:depth]) + "/"


def _family_of(module_or_path: str, families: set[str]) -> str | None:
    text = module_or_path.replace(".", "/")
    for family in families:
        if f"model_executor/models/{family}/" in text + "/":
            return family
    return None


def figures(rev: str | None, root: Path) -> Figures:
    sources = _sources(rev, root)
    out = Figures(rev=rev or "working tree")
    families = {p[len(MODELS) :].split("/")[0] for p in sources if p.startswith(MODELS) and p.endswith("/family.py")}
    lines: Counter[str] = Counter()
    classes: list[tuple[int, str]] = []
    for path, text in sources.items():
        lines[_folder_key(path)] += len(text.splitlines())
        tree = ast.parse(text)
        source_family = _family_of(path, families)
        below = path.split("/", 1)[1]
        shared = source_family is None and not below.startswith(ABOVE_FAMILIES)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.append((node.end_lineno - node.lineno + 1, f"{below}:{node.name}"))
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
                target = _family_of(node.module, families)
                if target is None:
                    continue
                where = f"{below}:{node.lineno} -> {node.module}"
                if source_family is not None and target != source_family:
                    out.family_to_family.append(where)
                elif shared:
                    out.shared_to_family.append(where)
    out.total_lines = sum(lines.values())
    out.lines_by_folder = dict(sorted(lines.items(), key=lambda kv: -kv[1]))
    out.largest_classes = sorted(classes, reverse=True)[:8]
    out.files_per_family = {
        f: sum(1 for p in sources if p.startswith(f"{MODELS}{f}/") and not p.endswith("__init__.py"))
        for f in sorted(families)
    }
    return out


def _print(fig: Figures) -> None:
    print(f"# {fig.rev}: {fig.total_lines} lines in {PACKAGE}/")
    for folder, n in fig.lines_by_folder.items():
        print(f"{n:7d}  {100 * n / fig.total_lines:5.1f} %  {folder}")
    print("largest classes:")
    for n, name in fig.largest_classes:
        print(f"{n:7d}  {name}")
    print("files per family (without __init__):", fig.files_per_family)
    print(f"family -> family imports: {len(fig.family_to_family)}")
    for line in fig.family_to_family:
        print(f"    {line}")
    print(f"shared -> family imports: {len(fig.shared_to_family)}")
    for line in fig.shared_to_family:
        print(f"    {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", help="a git revision (default: the working tree)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parents[1]
    fig = figures(args.rev, root)
    if args.json:
        print(json.dumps(asdict(fig), indent=1))
    else:
        _print(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
