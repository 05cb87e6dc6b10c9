# SPDX-License-Identifier: Apache-2.0
"""The causal-HiFT streaming recorder: one command, three files under `--results-dir`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.recorder import NamedRecorder, recorder

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def _recorder() -> NamedRecorder:
    return recorder("causal_hift_stream")


def test_recorder_keeps_table_json_and_plot_of_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--chunks", "3", "--chunk-frames", "10", "--warmup-chunks", "0", "--device", "cpu", "--threads", "1"]
    assert _recorder().main([*argv, "--results-dir", str(tmp_path)]) == 0
    stem = tmp_path / "causal_hift_stream_cpu"
    table = Path(f"{stem}.txt").read_text()
    assert "bounded ms" in table and "cumulative ms" in table
    assert json.loads(Path(f"{stem}.json").read_text())["config"]["chunks"] == 3
    assert Path(f"{stem}.png").stat().st_size > 0
    capsys.readouterr()


def test_recorder_refuses_a_results_dir_without_a_folder(capsys: pytest.CaptureFixture[str]) -> None:
    assert _recorder().main(["--results-dir"]) == 2
    assert "record.py causal_hift_stream: --results-dir needs a folder" in capsys.readouterr().err
