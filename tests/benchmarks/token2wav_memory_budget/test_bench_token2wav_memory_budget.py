# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.token2wav_memory_budget`: a tiny run serves every reply within its budget and writes
the recorded layout (JSON keys of benchmarks/results/token2wav_memory_budget_cpu.json, the table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.bench_cli import run_dev

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"


def test_a_tiny_run_waits_completes_every_reply_and_writes_the_recorded_layout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "budget.json"
    argv = ["--seconds", "3", "--streams", "3", "--fit", "1", "--family-seconds", "2", "--n-timesteps", "2"]
    argv += ["--families", "cosyvoice3", "--kv-dtypes", "float32", "--budget-kv-dtypes", "float32", "--json", str(out)]
    code, stdout, _ = run_dev(capsys, "token2wav_memory_budget", *argv)
    assert code == 0 and "completed 3/3, errors 0" in stdout
    doc = json.loads(out.read_text())
    assert doc.keys() == json.loads((RESULTS / "token2wav_memory_budget_cpu.json").read_text()).keys()
    (served,) = doc["budget"]
    assert served["budget_waits"] >= 1 and served["max_live_streams"] == 1 and served["max_abs_vs_alone"] == 0.0
    assert served["peak_counted_bytes"] <= served["budget_bytes"]
    (row,) = doc["families"]
    assert row["arena_bytes_per_frame_measured"] == row["estimate_bytes_per_frame"]
    assert row["own_within_counted_every_chunk"] and row["own_bytes"] <= row["counted_bytes"]
    assert row["full_size_bytes_per_audio_second"] == 180_224_000  # 3.6 MB per frame x 50 frames per second
    assert out.with_suffix(".txt").read_text() in stdout
