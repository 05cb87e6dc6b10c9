# SPDX-License-Identifier: Apache-2.0
"""Run a `vllm-omni-token2wav bench` subcommand the two ways its tests need: as a user types it, and in-process.

The CLI tests of the micro-benchmarks (`test_bench_spk_embedding.py`, `test_bench_token2wav.py`)
check one real run in a subprocess (exit code, table, JSON and PNG written where `--json` / `--plot`
say) and the user errors in-process (exit code and the one-line message); both are the same steps
for every benchmark, so they are written once here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vllm_omni_token2wav.entrypoints.cli.main import main


def run_bench_subprocess(
    out: Path, *args: str, timeout: float, report_files: bool = True
) -> subprocess.CompletedProcess[str]:
    """`python -m vllm_omni_token2wav bench <args> --json <out>/report.json --plot <out>/report.png`, run in `out`.

    `report_files=False` leaves out `--json` / `--plot`: the reports go where the command puts them by default.
    """
    files = ["--json", str(out / "report.json"), "--plot", str(out / "report.png")] if report_files else []
    cmd = [sys.executable, "-m", "vllm_omni_token2wav", "bench", *args, *files]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=out)


def run_bench(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `vllm-omni-token2wav bench <args>` run in this process."""
    code = main(["bench", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err
