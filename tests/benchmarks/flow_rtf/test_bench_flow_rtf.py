# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.flow_rtf`: a reduced run as typed keeps the recorded layout; option errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.bench_cli import run_dev
from tests.helpers.torch_state import one_intra_op_thread

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"


def test_reduced_run_times_whole_and_stream_and_keeps_the_recorded_layout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "flow_rtf.json"
    argv = ["--config", "reduced", "--gen-seconds", "1.2", "--prompt-seconds", "1", "--timesteps", "1"]
    with one_intra_op_thread():
        code, stdout, _ = run_dev(capsys, "flow_rtf", *argv, "--runs", "1", "--device", "cpu", "--json", str(out))
    assert code == 0 and "frames/s" in stdout
    doc = json.loads(out.read_text())
    assert doc.keys() == json.loads((RESULTS / "flow_rtf.json").read_text()).keys()
    assert [(r["mode"], r["n_timesteps"]) for r in doc["results"]] == [("whole", 1), ("stream", 1)]
    assert all(r["rtf"] > 0 and r["mel_frames_per_s"] > 0 for r in doc["results"])


def test_runs_below_one_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_dev(capsys, "flow_rtf", "--config", "reduced", "--device", "cpu", "--runs", "0")
    assert code == 2 and "--runs must be >= 1" in err and "Traceback" not in err
