# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.causal_hift_stream`: one small run as a user types it, and the option errors.

The run uses the reduced stand-in (the shipped layout, narrow layers): it checks the report's shape
and honesty (both curves, ratios only where measured, the two streams' audio agreeing, the files
written) rather than any speed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks.causal_hift_stream.report import render_text
from benchmarks.causal_hift_stream.run import StreamBenchReport
from tests.helpers.bench_cli import run_dev, run_dev_subprocess

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def e2e(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("causal_hift_bench")
    proc = run_dev_subprocess(
        out,
        "causal_hift_stream",
        "--chunks",
        "5",
        "--chunk-frames",
        "12",
        "--warmup-chunks",
        "1",
        "--device",
        "cpu",
        "--threads",
        "1",
        timeout=600,
    )
    return {"proc": proc, "json": out / "report.json", "png": out / "report.png"}


def test_small_run_prints_the_table_and_writes_json_and_plot(e2e: dict[str, Any]) -> None:
    proc = e2e["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in ("bounded ms", "cumulative ms", "streaming RTF", "reduced stand-in", "max |diff|"):
        assert needle in proc.stdout
    assert f"wrote {e2e['json']} and {e2e['png']}" in proc.stdout
    assert e2e["png"].read_bytes().startswith(PNG_SIGNATURE)


def test_report_has_both_curves_and_the_streams_agree(e2e: dict[str, Any]) -> None:
    assert e2e["proc"].returncode == 0, e2e["proc"].stderr
    report = json.loads(e2e["json"].read_text())
    assert report["schema"] == "vllm-omni/bench-causal-hift/1" and report["complete"] is True
    assert (report["config"]["chunks"], report["config"]["chunk_frames"]) == (5, 12)
    for mode in ("bounded", "cumulative"):
        medians = report["median_chunk_ms"][mode]
        assert len(medians) == 5 and all(math.isfinite(v) and v > 0 for v in medians)
        assert report["summary"][mode]["rtf"] > 0
    # Chunks 20 and 50 were not measured: no ratio is invented for them.
    assert report["summary"]["ratio_cumulative_over_bounded"] == {"20": None, "50": None}
    assert report["audio_max_abs_diff"] <= 1e-6 and report["audio_peak_abs"] > 1e-3
    assert report["environment"]["threads"] == 1 and report["weights"]["parameters"] > 0


def test_ratio_is_the_median_cumulative_over_the_median_bounded_time() -> None:
    report = StreamBenchReport(config={"chunks": 50, "chunk_frames": 50, "runs": 2, "warmup_chunks": 0})
    report.chunk_ms["bounded"] = [[10.0] * 50, [30.0] * 50]
    report.chunk_ms["cumulative"] = [[float(k + 1) * 10 for k in range(50)], [float(k + 1) * 30 for k in range(50)]]
    assert report.ratio_at(20) == pytest.approx(20.0) and report.ratio_at(50) == pytest.approx(50.0)
    assert report.rtf("bounded") == pytest.approx(20e-3 * 50 / 50.0)
    assert "chunk 20: 20.00, chunk 50: 50.00" in render_text(report)
    assert "PARTIAL" in render_text(report)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--chunks", "0"], "--chunks must be >= 1"),
        (["--chunk-frames", "0"], "--chunk-frames must be >= 1"),
        (["--warmup-chunks", "-1"], "--warmup-chunks must be >= 0"),
        (["--device", "tpu"], "--device 'tpu'"),
        (["--hift", "/nonexistent/hift.pt"], "no such file"),
    ],
)
def test_usage_errors_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    argv = args if "--device" in args else ["--device", "cpu", *args]
    code, _, err = run_dev(capsys, "causal_hift_stream", *argv)
    assert code == 2
    assert message in err and "Traceback" not in err


def test_full_and_hift_are_exclusive(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        run_dev(capsys, "causal_hift_stream", "--full", "--hift", str(tmp_path / "hift.pt"))
    assert exc.value.code == 2
