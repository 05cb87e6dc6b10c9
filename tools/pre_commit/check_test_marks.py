#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fail when a test lacks a level mark or a hardware mark.

Usage: check_test_marks.py FILE... (with no files: every `tests/**/test_*.py`).

Every test function and test class must be covered, through its own decorators, its class, or
the module's `pytestmark`, by one level mark (`core_model`, `advanced_model`, `full_model`) and one
hardware mark (`cpu`, `cuda`, `npu`, or a `hardware_test(...)` call). Marks are read statically
from the AST, so the check runs without importing the test (and without torch).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

LEVEL = {"core_model", "advanced_model", "full_model"}
HARDWARE = {"cpu", "cuda", "npu", "hardware_test"}


def _mark_names(node: ast.AST) -> set[str]:
    """Names of the marks an expression applies: `pytest.mark.x`, `x` imported as a mark, `hardware_test(...)`."""
    names: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in LEVEL | HARDWARE:
            names.add(sub.attr)
        elif isinstance(sub, ast.Name) and sub.id in LEVEL | HARDWARE:
            names.add(sub.id)
    return names


def _module_marks(tree: ast.Module) -> set[str]:
    marks: set[str] = set()
    for stmt in tree.body:
        targets: list[ast.expr] = []
        if isinstance(stmt, ast.Assign):
            targets = list(stmt.targets)
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets = [stmt.target]
        if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            marks |= _mark_names(stmt.value)  # type: ignore[arg-type]
    return marks


def _decorator_marks(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> set[str]:
    marks: set[str] = set()
    for dec in node.decorator_list:
        marks |= _mark_names(dec)
    return marks


def _missing(marks: set[str]) -> list[str]:
    out = []
    if not marks & LEVEL:
        out.append("a level mark (core_model/advanced_model/full_model)")
    if not marks & HARDWARE:
        out.append("a hardware mark (cpu or hardware_test(...))")
    return out


def check_file(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as exc:
        return [f"{path}:{exc.lineno}: cannot parse: {exc.msg}"]
    module = _module_marks(tree)
    errors: list[str] = []
    tests_found = False
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.name.startswith("test"):
            tests_found = True
            missing = _missing(module | _decorator_marks(stmt))
            if missing:
                errors.append(f"{path}:{stmt.lineno}: {stmt.name} needs {' and '.join(missing)}")
        elif isinstance(stmt, ast.ClassDef) and stmt.name.startswith("Test"):
            tests_found = True
            cls_marks = module | _decorator_marks(stmt)
            for item in stmt.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name.startswith("test"):
                    missing = _missing(cls_marks | _decorator_marks(item))
                    if missing:
                        errors.append(f"{path}:{item.lineno}: {stmt.name}.{item.name} needs {' and '.join(missing)}")
    if not tests_found:
        missing = _missing(module)
        if missing:
            errors.append(f"{path}: test module without tests needs {' and '.join(missing)} in pytestmark")
    return errors


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] if argv else sorted(Path("tests").rglob("test_*.py"))
    errors: list[str] = []
    for path in paths:
        if path.name.startswith("test_") and path.suffix == ".py":
            errors.extend(check_file(path))
    for line in errors:
        print(line, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
