# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.token2wav_stream_memory`: a reduced run writes the recorded layout, JSON and table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.bench_cli import run_dev

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"


@pytest.mark.slow
def test_reduced_run_writes_json_and_table_in_the_recorded_layout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "memory.json"
    argv = ["--reduced", "--chunks", "3", "--n-timesteps", "2", "--prompt-seconds", "2", "--json", str(out)]
    code, stdout, _ = run_dev(capsys, "token2wav_stream_memory", *argv)
    assert code == 0 and "bf16 caches vs fp32" in stdout
    doc = json.loads(out.read_text())
    assert doc.keys() == json.loads((RESULTS / "token2wav_stream_memory.json").read_text()).keys()
    assert doc["kind"] == "stand-in (reduced size)" and doc["prompt_frames"] == 100
    assert out.with_suffix(".txt").read_text() in stdout
