# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.cosyvoice3_flow_stream`: option errors and one small run as a user types it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.bench_cli import run_dev, run_dev_subprocess

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def test_small_run_prints_the_table_and_writes_json_and_plot(tmp_path: Path) -> None:
    proc = run_dev_subprocess(
        tmp_path,
        "cosyvoice3_flow_stream",
        *("--device", "cpu", "--threads", "1", "--chunks", "3", "--n-timesteps", "1", "--repeats", "1"),
        *("--prompt-tokens", "25", "--baseline-at", "1,3,50"),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cost per chunk vs chunk index" in proc.stdout and "Traceback" not in proc.stderr
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["config"]["baseline_at"] == [1, 3], "indices past --chunks are dropped"
    assert doc["summary"]["max_abs_diff"] <= 1e-5
    assert (tmp_path / "report.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--full", "--model-dir", "."), "cannot be combined with --model-dir"),
        (("--model-dir", "/nonexistent"), "no flow.pt inside"),
        (("--baseline-at", "1,x"), "expected comma-separated chunk indices"),
        (("--chunks", "0"), "chunks must be >= 1"),
        (("--device", "tpu"), "expected auto, cpu"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    code, _, err = run_dev(capsys, "cosyvoice3_flow_stream", *args)
    assert code == 2 and message in err and "Traceback" not in err
