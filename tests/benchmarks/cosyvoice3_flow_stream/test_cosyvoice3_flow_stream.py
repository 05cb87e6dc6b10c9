# SPDX-License-Identifier: Apache-2.0
"""The CosyVoice3 flow streaming benchmark: what it measures, its report, and its rendering (tiny runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.cosyvoice3_flow_stream import report as render
from benchmarks.cosyvoice3_flow_stream.run import BenchConfig, BenchSetupError, FlowStreamBenchmark
from tests.helpers.torch_state import one_intra_op_thread

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch_module.setenv("VLLM_OMNI_TOKEN2WAV_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    config = BenchConfig(device="cpu", prompt_tokens=30, chunks=4, n_timesteps=1, repeats=2, baseline_at=(1, 4))
    with one_intra_op_thread():
        return FlowStreamBenchmark(config).run()


@pytest.fixture(scope="module")
def monkeypatch_module():  # type: ignore[no-untyped-def]
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_every_chunk_is_timed_each_repeat_and_the_baseline_where_asked(report) -> None:  # type: ignore[no-untyped-def]
    assert [c.index for c in report.chunks] == [1, 2, 3, 4]
    assert all(len(c.ours_ms) == 2 and min(c.ours_ms) > 0 for c in report.chunks)
    assert [len(c.baseline_ms) for c in report.chunks] == [2, 0, 0, 2]
    # upstream's first hop pads a 30-token prompt to 50 tokens: 45 tokens, then 25 per chunk
    assert [c.frames for c in report.chunks] == [90, 50, 50, 50]
    assert [c.history_frames for c in report.chunks] == [60, 150, 200, 250]
    assert len(report.setup_ms) == 2


def test_the_cached_chunks_equal_the_prefix_rerun_they_are_timed_against(report) -> None:  # type: ignore[no-untyped-def]
    diffs = [c.max_abs_diff for c in report.chunks if c.baseline_ms]
    assert len(diffs) == 2 and max(diffs) <= 1e-5


def test_the_last_call_is_timed_with_full_attention_and_block_causal_each_repeat(report) -> None:  # type: ignore[no-untyped-def]
    final = report.final
    assert len(final.full_attention_ms) == len(final.block_causal_ms) == len(final.stream_ms) == 2
    assert min(final.full_attention_ms + final.block_causal_ms + final.full_attention_cpu_ms) > 0
    # the stream's chunks (45 + 3 x 25 tokens + 3 lookahead) then the last call's 25 tokens, after a 30-token prompt
    assert final.tokens == 25 and final.utterance_frames == 2 * (30 + 45 + 3 * 25 + 3 + 25)
    assert final.generated_seconds == pytest.approx((45 + 3 * 25 + 3 + 25) / 25)
    # the two last calls are different computations of the same frames
    assert final.max_abs_diff is not None and final.max_abs_diff > 1e-6
    s = report.summary()["final_chunk"]
    assert s["adds_ms_per_utterance"] == pytest.approx(s["full_attention_ms"] - s["block_causal_ms"])
    assert s["full_over_block"] == pytest.approx(s["full_attention_ms"] / s["block_causal_ms"])
    assert s["stream_ms"] >= sum(c.ours_median_ms for c in report.chunks) * 0.5


def test_the_last_call_comparison_needs_a_full_attention_stream(tmp_path: Path) -> None:
    from tests.model_executor.layers.flow.inputs import make_prompt, make_tokens
    from vllm_omni_token2wav.benchmarks.token2wav.cosyvoice3.chunk_costs import FinalChunkCost, measure_final_chunk
    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import (
        FinalChunk,
        load_flow,
        start_stream,
        write_standin_flow,
    )

    write_standin_flow(tmp_path, reduced=True, seed=3)
    flow = load_flow(tmp_path, device="cpu")
    state = start_stream(flow, *make_prompt(5, seed=1), n_timesteps=1, final_chunk=FinalChunk.BLOCK_CAUSAL)
    with pytest.raises(BenchSetupError, match="FULL_ATTENTION"):
        measure_final_chunk(flow, state, make_tokens(4), sync=lambda: None, cost=FinalChunkCost(), full_first=True)


def test_report_renders_as_table_json_and_png(report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    text = render.render_text(report)
    assert "chunk  history frames" in text and "prefix re-run / ours at chunk 20: - x" in text
    render.write_json(report, tmp_path / "r.json")
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["benchmark"] == "cosyvoice3_flow_stream" and doc["config"]["first_hop"] == 45
    assert doc["chunks"][3]["ratio"] > 0 and doc["chunks"][1]["ratio"] is None
    assert doc["summary"]["ratio_at_20"] is None and doc["weights"]["kind"].startswith("stand-in")
    assert "full attention (default, upstream's last call)" in text and "adds" in text
    assert doc["summary"]["final_chunk"]["final_tokens"] == 25 and len(doc["final_chunk"]["block_causal_ms"]) == 2
    render.write_plot(report, tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes().startswith(b"\x89PNG")


def test_config_errors_name_the_option() -> None:
    with pytest.raises(BenchSetupError, match="baseline-at \\[9\\]"):
        BenchConfig(chunks=5, baseline_at=(1, 9)).validate()
    with pytest.raises(BenchSetupError, match="hop-tokens must be >= 1"):
        BenchConfig(hop_tokens=0).validate()
    assert BenchConfig(prompt_tokens=75).first_hop == 25 and BenchConfig(prompt_tokens=76).first_hop == 49
