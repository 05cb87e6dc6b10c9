# SPDX-License-Identifier: Apache-2.0
"""Atomic writes: the target is either the old or the new content, and no temporary file is left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_omni.atomic_io import atomic_output, write_bytes_atomic, write_json_atomic

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def test_failed_write_keeps_old_file_and_removes_tmp(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="boom"), atomic_output(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_tmp_keeps_suffix_and_folder_is_created(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "plot.png"
    with atomic_output(target) as tmp:
        assert tmp.parent == target.parent and tmp.suffix == ".png" and tmp != target
        tmp.write_bytes(b"png")
    assert target.read_bytes() == b"png"


@pytest.mark.parametrize("fsync", [False, True])
def test_bytes_and_json_round_trip(tmp_path: Path, fsync: bool) -> None:
    write_bytes_atomic(tmp_path / "a.bin", b"\x00\x01", fsync=fsync)
    write_json_atomic(tmp_path / "b.json", {"wer": 1.5, "utt": "ä"}, fsync=fsync)
    assert (tmp_path / "a.bin").read_bytes() == b"\x00\x01"
    assert json.loads((tmp_path / "b.json").read_text(encoding="utf-8")) == {"wer": 1.5, "utt": "ä"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "b.json"]
