# SPDX-License-Identifier: Apache-2.0
"""The CosyVoice3 code2wav benchmark: what it measures, its summary, and its rendering (one tiny run)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers.torch_state import one_intra_op_thread
from vllm_omni_token2wav.benchmarks.token2wav.cosyvoice3 import report as render
from vllm_omni_token2wav.benchmarks.token2wav.cosyvoice3.run import (
    BenchConfig,
    BenchSetupError,
    CosyVoice3Benchmark,
    VocoderCost,
    default_plan,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

SIZES = {"gen_seconds": 0.6, "prompt_seconds": 1.0, "n_timesteps": 1, "runs": 1, "warmup": 0}


@pytest.fixture(scope="module")
def report():  # type: ignore[no-untyped-def]
    config = BenchConfig(device="cpu", chunks=3, baseline_at=(1, 3), **SIZES)  # type: ignore[arg-type]
    with one_intra_op_thread():
        return CosyVoice3Benchmark(config).run()


def test_both_modes_and_every_chunk_are_timed_and_the_baseline_where_asked(report) -> None:  # type: ignore[no-untyped-def]
    whole, stream = report.mode("whole"), report.mode("stream")
    assert whole.audio_seconds == stream.audio_seconds == 15 * 960 / 24000
    assert len(whole.total_ms) == len(stream.total_ms) == 1 and 0 < stream.first_audio_ms[0] <= stream.total_ms[0]
    assert [c.index for c in report.flow] == [v.index for v in report.vocoder] == [1, 2, 3]
    assert [len(v.baseline_ms) for v in report.vocoder] == [1, 0, 1]
    # upstream's first hop pads the 25-token prompt to 25: 25 tokens, then 25 per chunk
    assert [c.frames for c in report.flow] == [50, 50, 50]


def test_ours_equals_what_it_is_timed_against(report) -> None:  # type: ignore[no-untyped-def]
    s = report.summary()
    assert s["mel_max_abs_diff"] <= 1e-5 and s["audio_max_abs_diff"] <= 1e-6
    rows = {r["index"]: r for r in report.rows()}
    assert rows[3]["ratio"] > 0 and math.isnan(rows[2]["ratio"])


def test_report_renders_as_table_json_and_png(report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    text = render.render_text(report)
    for needle in ("RTF", "first audio ms", "cost per chunk", "upstream / ours at chunk 20: - x", "reduced stand-in"):
        assert needle in text
    render.write_json(report, tmp_path / "r.json")
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["benchmark"] == "token2wav_cosyvoice3" and doc["config"]["first_hop"] == 25
    assert doc["summary"]["ratio_at_20"] is None and doc["chunks"][1]["ratio"] is None
    assert doc["modes"][1]["first_audio_median_ms"] > 0
    render.write_plot(report, tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes().startswith(b"\x89PNG")


def test_summary_ratios_come_from_the_chunks_they_name(report) -> None:  # type: ignore[no-untyped-def]
    from vllm_omni_token2wav.benchmarks.token2wav.cosyvoice3.chunk_costs import ChunkCost

    fake = type(report)()
    for k in range(1, 21):
        fake.flow.append(ChunkCost(k, 50, 50 * k, ours_ms=[10.0], ours_cpu_ms=[10.0]))
        fake.vocoder.append(VocoderCost(k, ours_ms=[5.0], ours_cpu_ms=[5.0]))
    fake.flow[19].baseline_ms, fake.flow[19].baseline_cpu_ms = [100.0], [100.0]
    fake.vocoder[19].baseline_ms, fake.vocoder[19].baseline_cpu_ms = [50.0], [50.0]
    s = fake.summary()
    assert s["ratio_at_20"] == s["cpu_ratio_at_20"] == 150.0 / 15.0 and s["ratio_at_50"] is None
    assert s["ours_last_over_chunk2"] == 1.0


def test_plans_and_config_errors_name_the_option() -> None:
    assert default_plan(full=True, device_type="cpu").n_timesteps == 1
    assert (
        default_plan(full=True, device_type="cuda").chunks == 50 == default_plan(full=False, device_type="cpu").chunks
    )
    with pytest.raises(BenchSetupError, match=r"baseline-at \[9\]"):
        BenchConfig(chunks=5, baseline_at=(1, 9)).validate()
    with pytest.raises(BenchSetupError, match="prompt-seconds 40"):
        BenchConfig(prompt_seconds=40).validate()
    with pytest.raises(BenchSetupError, match="noise table holds 15000"):
        BenchConfig(chunks=400, baseline_at=(1,)).validate()


def test_recorder_keeps_table_json_and_plot_of_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.helpers.recorder import recorder as named_recorder

    recorder = named_recorder("token2wav_cosyvoice3")
    argv = [
        "--chunks",
        "1",
        "--baseline-at",
        "1",
        "--gen-seconds",
        "0.2",
        "--prompt-seconds",
        "1",
        "--n-timesteps",
        "1",
    ]
    argv += ["--runs", "1", "--warmup", "0", "--device", "cpu", "--threads", "1", "--results-dir", str(tmp_path)]
    assert recorder.main(argv) == 0
    stem = tmp_path / "token2wav_cosyvoice3_cpu"
    assert "CosyVoice3 code2wav" in Path(f"{stem}.txt").read_text()
    assert json.loads(Path(f"{stem}.json").read_text())["config"]["chunks"] == 1
    assert Path(f"{stem}.png").stat().st_size > 0
    capsys.readouterr()
