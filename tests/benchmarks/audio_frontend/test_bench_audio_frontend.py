# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.audio_frontend`: a one-case run keeps the recorded layout; option errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.bench_cli import run_dev

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"


def test_one_case_run_reports_speed_and_agreement_in_the_recorded_layout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("kaldi_native_fbank", reason="the reference fbank comes with the dev extra")
    out = tmp_path / "audio_frontend.json"
    # `--out`, the spelling before `--json`, still parses (hidden from --help)
    argv = ["--device", "cpu", "--durations", "1", "--batches", "1", "--repeats", "1", "--out", str(out)]
    code, stdout, _ = run_dev(capsys, "audio_frontend", *argv)
    assert code == 0 and "agreement (max / mean |diff|):" in stdout
    doc = json.loads(out.read_text())
    recorded = json.loads((RESULTS / "audio_frontend.json").read_text())
    assert doc.keys() == recorded.keys() and doc["agreement"].keys() == recorded["agreement"].keys()
    assert [(r["seconds"], r["batch"]) for r in doc["speed"]] == [(1.0, 1)]


def test_repeats_below_one_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_dev(capsys, "audio_frontend", "--repeats", "0")
    assert code == 2 and "--repeats must be >= 1" in err and "Traceback" not in err
