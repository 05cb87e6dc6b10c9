# SPDX-License-Identifier: Apache-2.0
"""A patch runs right after its module executes, or at once if it is already imported; owners stay apart."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from vllm_omni_token2wav.import_hooks import AfterImport, Patch, install_after_import, uninstall_after_import

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

OWNERS = ("test-owner-a", "test-owner-b")


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh importable package `t2w_hook_pkg` with a module `mod` (value = 1), removed afterwards."""
    root = tmp_path / "t2w_hook_pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "mod.py").write_text("value = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "t2w_hook_pkg.mod"
    for owner in OWNERS:
        uninstall_after_import(owner)
    for name in [n for n in sys.modules if n.split(".")[0] == "t2w_hook_pkg"]:
        del sys.modules[name]


def _add(amount: int) -> Patch:
    def patch(module: ModuleType) -> None:
        module.value += amount  # type: ignore[attr-defined]

    return patch


def test_a_module_imported_later_is_patched_right_after_it_executes(package: str) -> None:
    install_after_import(OWNERS[0], {package: _add(10)})
    install_after_import(OWNERS[0], {package: _add(10)})  # idempotent per owner: still one finder
    assert sum(isinstance(f, AfterImport) and f.owner == OWNERS[0] for f in sys.meta_path) == 1
    module = __import__(package, fromlist=["value"])
    assert module.value == 11


def test_an_imported_module_is_patched_at_once(package: str) -> None:
    module = __import__(package, fromlist=["value"])
    install_after_import(OWNERS[0], {package: _add(5)})
    assert module.value == 6


def test_two_owners_of_one_module_both_patch_it_without_asking_each_other(package: str) -> None:
    install_after_import(OWNERS[0], {package: _add(10)})
    install_after_import(OWNERS[1], {package: _add(100)})
    module = __import__(package, fromlist=["value"])
    assert module.value == 111


def test_uninstall_takes_only_that_owners_finder_off(package: str) -> None:
    install_after_import(OWNERS[0], {package: _add(10)})
    install_after_import(OWNERS[1], {package: _add(100)})
    uninstall_after_import(OWNERS[0])
    assert [f.owner for f in sys.meta_path if isinstance(f, AfterImport) and f.owner in OWNERS] == [OWNERS[1]]
    module = __import__(package, fromlist=["value"])
    assert module.value == 101
