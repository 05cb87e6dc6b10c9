# SPDX-License-Identifier: Apache-2.0
"""Run a patch on a module right after it is imported, or at once if it already is.

Three places act on upstream modules in processes they do not start: the toy CosyVoice3 pipeline's doors
(`model_executor/models/standin/toy/cosyvoice3_door.py`), the toy chunk recorder (`.../toy/recorder.py`) and
the edge benchmark's transfer timer (`benchmarks/token2wav_serve/transfer_site/sitecustomize.py`). They run
from a `sitecustomize` before vLLM-Omni is imported, so they cannot patch at start-up; a `sys.meta_path`
finder here finds the named module through the other finders and wraps its loader, so the patch runs right
after the module executes, before anyone else can use it.

`install_after_import(owner, patches)` is idempotent per `owner` (one finder each); patches must be
idempotent too (a module imported before `install_after_import` is patched at once). Standard library only:
`sitecustomize` imports this at interpreter start-up.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType

Patch = Callable[[ModuleType], None]


class _PatchingLoader(importlib.abc.Loader):
    """Runs the module's own loader, then its patches."""

    def __init__(self, inner: importlib.abc.Loader, patches: Sequence[Patch]) -> None:
        self._inner = inner
        self._patches = patches

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        for patch in self._patches:
            patch(module)


class AfterImport(importlib.abc.MetaPathFinder):
    """Finds the modules of `patches` through the other finders and wraps their loaders."""

    def __init__(self, owner: str, patches: Mapping[str, Patch]) -> None:
        self.owner = owner
        self.patches = dict(patches)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.patches:
            return None
        # The first finder asked answers for every owner that patches this module; the others are skipped so
        # that no finder asks another (which would ask it back).
        patches = [f.patches[fullname] for f in sys.meta_path if isinstance(f, AfterImport) and fullname in f.patches]
        for finder in sys.meta_path:
            if isinstance(finder, AfterImport) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader, patches)
                return spec
        return None


def install_after_import(owner: str, patches: Mapping[str, Patch]) -> None:
    """Patch each module of `patches` now if imported, else right after its import (one finder per `owner`)."""
    if not any(isinstance(f, AfterImport) and f.owner == owner for f in sys.meta_path):
        sys.meta_path.insert(0, AfterImport(owner, patches))
    for name, patch in patches.items():
        module = sys.modules.get(name)
        if module is not None:
            patch(module)


def uninstall_after_import(owner: str) -> None:
    """Take `owner`'s finder off `sys.meta_path` (what it patched stays patched: undo that yourself)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not (isinstance(f, AfterImport) and f.owner == owner)]


__all__ = ["AfterImport", "Patch", "install_after_import", "uninstall_after_import"]
