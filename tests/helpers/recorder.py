# SPDX-License-Identifier: Apache-2.0
"""`benchmarks/record.py NAME` as the tests drive it: loaded from the checkout, run in-process."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
RECORD_SCRIPT = REPO / "benchmarks" / "record.py"


def load_script(path: Path, name: str) -> ModuleType:
    """A script of the checkout as module `name` (not a package module: loaded from its file, like `python` runs it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record_script() -> ModuleType:
    """The `benchmarks/record.py` module."""
    return load_script(RECORD_SCRIPT, "benchmarks_record")


@dataclass(frozen=True)
class NamedRecorder:
    """One NAME of record.py: `main(argv)` is `record.py NAME argv`, `stem_for(argv)` its variant name."""

    name: str

    def main(self, argv: Sequence[str]) -> int:
        return int(record_script().main([self.name, *argv]))

    @property
    def stem_for(self) -> Callable[[Sequence[str]], str]:
        from benchmarks import all_recorders

        return all_recorders()[self.name].stem_for


def recorder(name: str) -> NamedRecorder:
    return NamedRecorder(name)
