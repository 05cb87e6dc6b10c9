# SPDX-License-Identifier: Apache-2.0
"""The patch register: the code table, the doc table and the patch modules agree; the checks fail loudly.

Every module under `vllm_omni_token2wav/patch/platform/` and `patch/worker/` is a patch of one upstream object
and has exactly one row in `register.PATCHES`, which docs/design/patches.md renders. The install-time checks of
`patch/checks.py` are exercised here on stand-in objects (no engine needed): each failure names the symbol, the
expectation, the installed versions and the version the patch was written against.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from vllm_omni_token2wav.patch import checks, register
from vllm_omni_token2wav.patch.register import PATCHES

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "design" / "patches.md"
PATCH_DIR = REPO / "vllm_omni_token2wav" / "patch"
_BLOCK = re.compile(r"<!-- BEGIN PATCH TABLE[^>]*-->\n(.*?)\n<!-- END PATCH TABLE -->", re.S)


def test_the_doc_table_is_the_code_table() -> None:
    match = _BLOCK.search(DOC.read_text(encoding="utf-8"))
    assert match, f"{DOC}: no BEGIN/END PATCH TABLE block"
    assert match.group(1) == register.render_table(), (
        f"{DOC.name} and patch/register.py:PATCHES differ: paste render_table()'s output between the markers"
    )


def test_every_patch_module_has_one_row_and_every_row_a_module() -> None:
    modules = sorted(
        f"{path.parent.name}.{path.stem}"
        for group in ("platform", "worker")
        for path in (PATCH_DIR / group).glob("*.py")
        if path.name != "__init__.py"
    )
    rows = [row.module for row in PATCHES]
    assert sorted(rows) == modules, f"patch modules {modules} vs register rows {sorted(rows)}"
    assert len(set(rows)) == len(rows), f"a module has two rows: {rows}"
    for row in PATCHES:
        assert (REPO / row.path).is_file(), row.path
        assert row.module.split(".")[0] == row.group, (
            f"{row.module} sits in {row.module.split('.')[0]}/, not {row.group}/"
        )
        assert row.module.split(".")[1].startswith("patch_"), f"{row.module}: patch modules are named patch_<object>"


def test_every_row_says_why_how_upstream_removal_and_version() -> None:
    for row in PATCHES:
        for field in ("target", "why", "how", "upstream", "remove_when", "written_against"):
            assert getattr(row, field).strip(), f"{row.module}: empty {field}"
        assert "vLLM 0.30.0" in row.written_against and "vLLM-Omni 0.30.0" in row.written_against, row
        assert row.target.split(".")[0] in ("vllm", "vllm_omni", "vllm_ascend"), f"{row.target}: not an upstream object"


def test_each_patch_module_reads_its_own_row() -> None:
    import importlib

    for row in PATCHES:
        module = importlib.import_module(f"vllm_omni_token2wav.patch.{row.module}")
        assert module.ROW is row
    with pytest.raises(KeyError, match="no row for patch module 'worker.patch_missing'"):
        register.entry("worker.patch_missing")


ROW = PATCHES[1]


def _raises(call: Any, *needles: str) -> str:
    with pytest.raises(checks.UpstreamMismatchError) as info:
        call()
    message = str(info.value)
    for needle in (*needles, "Installed: vLLM ", "vLLM-Omni ", ROW.written_against, "patch/register.py"):
        assert needle in message, f"{needle!r} missing from: {message}"
    return message


def test_resolve_names_the_missing_part_and_the_versions() -> None:
    assert checks.resolve(ROW.module, ROW.written_against, "json.decoder.JSONDecoder.decode") is not None
    _raises(
        lambda: checks.resolve(ROW.module, ROW.written_against, "json.decoder.NoSuchDecoder.decode"),
        "json.decoder.NoSuchDecoder.decode",
        "no `NoSuchDecoder` on json.decoder",
    )
    _raises(
        lambda: checks.resolve(ROW.module, ROW.written_against, "no_such_top_module.x"), "no module no_such_top_module"
    )


def test_expect_callable_checks_the_leading_parameters_and_var_args() -> None:
    def good(self: Any, a: int, b: int, *args: Any, **kwargs: Any) -> None: ...

    def renamed(self: Any, a: int, c: int) -> None: ...

    assert checks.expect_callable(ROW.module, ROW.written_against, "m.good", good, parameters=("self", "a", "b"))
    checks.expect_callable(ROW.module, ROW.written_against, "m.good", good, parameters=("self",), var_args=True)
    _raises(
        lambda: checks.expect_callable(ROW.module, ROW.written_against, "m.f", renamed, parameters=("self", "a", "b")),
        "m.f",
        "parameters starting (self, a, b)",
        "(self: 'Any', a: 'int', c: 'int')",
    )
    _raises(
        lambda: checks.expect_callable(ROW.module, ROW.written_against, "m.f", renamed, var_args=True),
        "*args, **kwargs",
    )
    _raises(lambda: checks.expect_callable(ROW.module, ROW.written_against, "m.x", 3), "m.x", "a callable")


def test_expect_declared_attribute_accepts_an_annotation_on_a_base_and_refuses_a_rename() -> None:
    class Mixin:
        _queue: dict[str, int]

    class Scheduler(Mixin):
        pass

    class Renamed:
        _queue_v2: dict[str, int]

    checks.expect_declared_attribute(ROW.module, ROW.written_against, Scheduler, "m.Scheduler", "_queue")
    _raises(
        lambda: checks.expect_declared_attribute(ROW.module, ROW.written_against, Renamed, "m.Renamed", "_queue"),
        "m.Renamed._queue",
        "to declare `_queue`",
    )


def test_installed_versions_lists_the_three_upstreams() -> None:
    text = checks.installed_versions()
    assert text.startswith("vLLM ") and ", vLLM-Omni " in text and ", vLLM-Ascend " in text
