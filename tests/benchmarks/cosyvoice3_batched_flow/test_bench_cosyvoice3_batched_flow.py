# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.cosyvoice3_batched_flow`: a tiny run as typed (rows agree, JSON layout), option errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.bench_cli import run_dev
from tests.helpers.torch_state import one_intra_op_thread

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def test_small_run_prints_one_line_per_row_count_and_keeps_the_recorded_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "batched.json"
    argv = ["--rows", "1", "2", "--chunks", "2", "--n-timesteps", "1", "--json", str(out)]
    with one_intra_op_thread():
        code, stdout, _ = run_dev(capsys, "cosyvoice3_batched_flow", *argv)
    assert code == 0
    assert [line.split(":")[0] for line in stdout.splitlines()] == ["rows  1", "rows  2"]
    doc = json.loads(out.read_text())
    recorded = json.loads(
        (Path(__file__).resolve().parents[3] / "benchmarks/results/cosyvoice3_batched_flow_cpu.json").read_text()
    )
    assert doc.keys() == recorded.keys() and doc["runs"][0].keys() == recorded["runs"][0].keys()
    assert [r["rows"] for r in doc["runs"]] == [1, 2] and all(len(r["chunks"]) == 2 for r in doc["runs"])
    # one launch computes what the solo calls compute, row by row (the stage's batching contract)
    assert max(r["max_abs_diff"] for r in doc["runs"]) <= 1e-5


def test_whole_utterances_small_run_keeps_the_recorded_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "whole.json"
    argv = ["--whole", "--rows", "1", "2", "--chunks", "1", "--hop", "10", "--n-timesteps", "1", "--json", str(out)]
    with one_intra_op_thread():
        code, stdout, _ = run_dev(capsys, "cosyvoice3_batched_flow", *argv)
    assert code == 0
    assert [line.split(":")[0] for line in stdout.splitlines()] == ["whole rows  1", "whole rows  2"]
    doc = json.loads(out.read_text())
    recorded = json.loads(
        (Path(__file__).resolve().parents[3] / "benchmarks/results/cosyvoice3_batched_flow_whole_cpu.json").read_text()
    )
    assert doc.keys() == recorded.keys() and doc["runs"][0].keys() == recorded["runs"][0].keys()
    assert max(r["max_abs_diff"] for r in doc["runs"]) <= 1e-5  # each row of the launch == its call alone


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--rows", "0"], "--rows must be >= 1"), (["--chunks", "0"], "--chunks must be >= 1")],
)
def test_option_errors_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = run_dev(capsys, "cosyvoice3_batched_flow", *argv)
    assert code == 2 and message in err and "Traceback" not in err
