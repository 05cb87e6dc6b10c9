# SPDX-License-Identifier: Apache-2.0
"""Atomic writes: the target is either the old or the new content, and no temporary file is left."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_omni_token2wav.atomic_io import atomic_output, write_bytes_atomic, write_json_atomic

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


def _umask(mask: int) -> int:
    return os.umask(mask)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002], ids=["umask022", "umask077", "umask002"])
def test_new_files_get_the_mode_a_plain_open_gives(tmp_path: Path, mask: int) -> None:
    previous = _umask(mask)
    try:
        (tmp_path / "plain.bin").write_bytes(b"x")  # the reference: open() under the same umask
        write_bytes_atomic(tmp_path / "atomic.bin", b"x")
        with atomic_output(tmp_path / "ctx.wav") as tmp:
            tmp.write_bytes(b"x")
    finally:
        _umask(previous)
    want = stat.S_IMODE((tmp_path / "plain.bin").stat().st_mode)
    assert want == 0o666 & ~mask
    for name in ("atomic.bin", "ctx.wav"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == want, name


def test_replacing_a_file_keeps_its_permissions(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    target.write_text("{}")
    target.chmod(0o640)
    write_json_atomic(target, {"n": 1})
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert json.loads(target.read_text()) == {"n": 1}


_KILLED_WRITER = """
import os, signal, sys
from vllm_omni_token2wav.atomic_io import atomic_output
with atomic_output(sys.argv[1]) as tmp:
    tmp.write_bytes(b"half written")
    print(tmp, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_writer_leftover(target: Path) -> Path:
    """Run a writer that is killed (SIGKILL) inside `atomic_output`; return the temporary it left."""
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_WRITER, str(target)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    leftover = Path(proc.stdout.strip())
    assert leftover.is_file() and leftover.parent == target.parent
    return leftover


def test_temporaries_of_killed_writers_are_removed_by_the_next_write(tmp_path: Path) -> None:
    target = tmp_path / "audio.wav"
    leftover = _killed_writer_leftover(target)
    assert leftover.name.startswith(".audio.wav.") and leftover.name.endswith(".tmp.wav")
    # Files that are not a dead writer's temporary of this target are left alone.
    other_target = tmp_path / ".audio.wav.bak"
    other_target.write_bytes(b"keep")
    live = tmp_path / f".audio.wav.{leftover.name.split('.')[3].split('-')[0]}-{os.getpid()}-abc.tmp.wav"
    live.write_bytes(b"another thread of this process is writing")
    write_bytes_atomic(target, b"new")
    assert target.read_bytes() == b"new"
    assert not leftover.exists()
    assert other_target.exists() and live.exists()


def test_a_different_target_does_not_touch_another_targets_temporaries(tmp_path: Path) -> None:
    leftover = _killed_writer_leftover(tmp_path / "a.json")
    write_bytes_atomic(tmp_path / "b.json", b"{}")
    assert leftover.exists()
    write_bytes_atomic(tmp_path / "a.json", b"{}")
    assert not leftover.exists()


def test_a_folder_as_target_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "out.wav").mkdir()
    with pytest.raises(IsADirectoryError, match="is a folder"), atomic_output(tmp_path / "out.wav"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.wav"]
