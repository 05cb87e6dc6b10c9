# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.prompt_path`: a one-length run (every case, the cache lookup hits); option errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.bench_cli import run_dev
from tests.helpers.torch_state import one_intra_op_thread

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"


@pytest.mark.slow
def test_one_length_run_times_every_case_and_keeps_the_recorded_layout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "prompt_path.json"
    with one_intra_op_thread():
        code, stdout, _ = run_dev(capsys, "prompt_path", "--seconds", "1", "--repeats", "20", "--json", str(out))
    assert code == 0 and "device backend" in stdout
    doc = json.loads(out.read_text())
    recorded = json.loads((RESULTS / "prompt_path.json").read_text())
    assert doc.keys() == recorded.keys() and doc["rows"][0].keys() == recorded["rows"][0].keys()
    # a warm cache answers far below a computed prompt: the lookup case really hit the cache
    assert doc["rows"][0]["hit_ms"] < doc["rows"][0]["ort_ms"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repeats", "19"], "--repeats must be >= 20"),
        (["--model-dir", "."], "has no campplus.onnx"),
    ],
)
def test_option_errors_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = run_dev(capsys, "prompt_path", *argv)
    assert code == 2 and message in err and "Traceback" not in err
