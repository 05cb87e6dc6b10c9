# SPDX-License-Identifier: Apache-2.0
"""`stop_process_group` takes down a server's whole process group, including what outlives its leader."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_omni_token2wav.benchmarks.engine_server import log_tail, stop_process_group

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

#: A leader that starts a child ignoring SIGINT (as an engine core busy in a kernel might), prints its pid, and
#: exits on SIGINT itself.
LEADER = """
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"],
    stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has exited
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_the_child_that_outlives_its_leader_is_killed_too() -> None:
    proc = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    try:
        start = time.monotonic()
        stop_process_group(proc, signal.SIGINT, grace_s=10.0)
        assert proc.poll() is not None
        deadline = time.monotonic() + 5.0
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the SIGINT-ignoring child of the group survived"
        assert time.monotonic() - start < 15.0
    finally:
        for pid in (proc.pid, child):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_log_tail_reads_the_last_lines_or_says_there_is_no_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("\n".join(f"line {i}" for i in range(100)))
    assert log_tail(log, 3) == "line 97\nline 98\nline 99"
    assert log_tail(tmp_path / "missing.log") == "(no log)"
