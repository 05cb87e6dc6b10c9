# SPDX-License-Identifier: Apache-2.0
"""Run a benchmark the two ways its tests need: as a user types it, and in-process.

A shipped one is `vllm-omni-token2wav bench <subcommand>` (`run_bench*`), a developer one of the checkout
`python -m benchmarks.<name>` (`run_dev*`).

The CLI tests of the micro-benchmarks (`test_bench_spk_embedding.py`, `test_bench_token2wav.py`)
check one real run in a subprocess (exit code, table, JSON and PNG written where `--json` / `--plot`
say) and the user errors in-process (exit code and the one-line message); both are the same steps
for every benchmark, so they are written once here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_omni_token2wav.entrypoints.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def run_bench_subprocess(
    out: Path, *args: str, timeout: float, report_files: bool = True
) -> subprocess.CompletedProcess[str]:
    """`python -m vllm_omni_token2wav bench <args> --json <out>/report.json --plot <out>/report.png`, run in `out`.

    `report_files=False` leaves out `--json` / `--plot`: the reports go where the command puts them by default.
    """
    files = ["--json", str(out / "report.json"), "--plot", str(out / "report.png")] if report_files else []
    cmd = [sys.executable, "-m", "vllm_omni_token2wav", "bench", *args, *files]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=out)


def run_dev_subprocess(
    out: Path, name: str, *args: str, timeout: float, report_files: bool = True
) -> subprocess.CompletedProcess[str]:
    """`python -m benchmarks.<name> <args> --json <out>/report.json --plot <out>/report.png`, run in `out`.

    A developer benchmark of the checkout: the repository root goes on `PYTHONPATH` (as running it from the
    root would put it on `sys.path`), since the command runs in `out`.
    """
    files = ["--json", str(out / "report.json"), "--plot", str(out / "report.png")] if report_files else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", f"benchmarks.{name}", *args, *files]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=out, env=env)


def run_dev(capsys: pytest.CaptureFixture[str], name: str, *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `python -m benchmarks.<name> <args>` run in this process."""
    from benchmarks import run_home

    code = run_home(name, args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_bench(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `vllm-omni-token2wav bench <args>` run in this process."""
    code = main(["bench", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err
