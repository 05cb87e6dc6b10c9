# SPDX-License-Identifier: Apache-2.0
"""The Token2Wav sections of the device check: the full-size stand-in, then the batched stage at 1 / 8 / 32.

- `stage_assets`: the stand-in token2wav directory (full size on an accelerator: speech tokenizer,
  flow, HiFT, ~1.2 GB, generated on first use; reduced with `--smoke`), timed, so later sections
  find it ready. Measured on the 2-core build host: 35.6 s wall for the full set from an empty
  cache (CAM++ 11.7 s, which the `assets` section has already made, tokenizer 8.6 s, flow 11.9 s,
  HiFT 0.5 s), so ~21 s remain here; the budget is 50 s.
- `token2wav`: the MiniCPM-o stage model driven as vLLM-Omni drives it, through the concurrency
  benchmark's machinery (`token2wav_serve`: producer chunking, one `forward` per scheduler step,
  TTFP / RTF / throughput per request), on one stage with its device graphs switched on and off
  (`set_device_graphs`) per level. Streaming: each request's 25 + 3 token chunks, the talker
  infinitely fast (every token exists at arrival, so the figures are the stage's own, as
  `token2wav_rtf` defines RTF), `c` requests at concurrency `c` in a closed loop, levels in the order
  1, 32, 8 so the issue's two goals are measured first; graphs on and off alternate which goes
  first. Whole: each request sends its whole reply as one chunk (MiniCPM-o's one-chunk stream), `c`
  of them in one step. Capture counters and the device allocator's bytes are recorded per run.

Goals recorded: `token2wav_stream_rtf_c1` (p50 RTF at concurrency 1, graphs on, <= 0.05 on the
full-size stand-in with 10 steps) and `token2wav_throughput_c32_over_c1` (audio seconds per second
at 32 over 1, graphs on, >= 8).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from vllm_omni_token2wav.benchmarks.device_check.stage import resampler
from vllm_omni_token2wav.platforms.device_graphs import FROM_PLATFORM

if TYPE_CHECKING:
    from vllm_omni_token2wav.benchmarks.device_check.sections import SectionContext


@dataclass(frozen=True)
class StageSizes:
    """What the token2wav section runs: levels (in order), request audio, Euler steps, reserve for `whole`."""

    levels: tuple[int, ...]
    audio_seconds: tuple[float, float]
    n_timesteps: int
    reference_seconds: float
    max_rows: int
    whole_reserve_s: float


SIZES: Final = StageSizes((1, 32, 8), (4.0, 6.0), 10, 6.0, 32, 25.0)
SMOKE_SIZES: Final = StageSizes((1, 2), (1.2, 1.6), 2, 1.0, 2, 5.0)
GOAL_STREAM_RTF: Final = 0.05
GOAL_THROUGHPUT_RATIO: Final = 8.0
#: Codec tokens per second of the emulated talker: every token exists when its request arrives.
INSTANT_TALKER: Final = 1e9


# ---------------------------------------------------------------------------------------------
# stage_assets
# ---------------------------------------------------------------------------------------------


def run_stage_assets(ctx: SectionContext) -> None:
    from vllm_omni_token2wav.benchmarks.common import token2wav_model_dir

    reduced = ctx.smoke
    with resampler() as which:  # the stand-in's default voice is the speech clip resampled to 24 kHz
        ctx.result["resampler"] = which
        start = time.perf_counter()
        path, weights = token2wav_model_dir(
            ctx.config.model_dir, reduced=reduced, seed=ctx.config.seed, stage=ctx.log, error=ValueError
        )
    ctx.result["seconds"] = time.perf_counter() - start
    ctx.result["weights"] = weights
    ctx.result["bytes"] = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    ctx.shared["token2wav_dir"] = path


def render_stage_assets(result: dict[str, Any]) -> list[str]:
    weights = result.get("weights", {})
    return [
        f"{weights.get('kind')} at {weights.get('path')}: {result.get('bytes', 0) / 1e9:.2f} GB, "
        f"ready in {result.get('seconds', 0.0):.1f} s (resampler: {result.get('resampler')})"
    ]


# ---------------------------------------------------------------------------------------------
# token2wav
# ---------------------------------------------------------------------------------------------


def _graph_totals(stage: Any) -> dict[str, Any] | None:
    graphs = stage.backend.graphs
    return None if graphs is None else graphs.summary()


def _row(
    kind: str, c: int, graphs: bool, run: Any, before: dict[str, Any] | None, after: dict[str, Any] | None
) -> dict[str, Any]:
    summary = run.summary()
    row: dict[str, Any] = {
        "kind": kind,
        "concurrency": c,
        "graphs": graphs,
        "stopped": summary["stopped"],
        "requests": summary["requests"],
        "audio_s": summary["audio_s"],
        "throughput_audio_s_per_s": summary["throughput_audio_s_per_s"],
        "rtf_p50": summary["rtf"]["p50"],
        "rtf_p90": summary["rtf"]["p90"],
        "ttfp_p50_s": summary["ttfp_s"]["p50"],
        "ttfp_p90_s": summary["ttfp_s"]["p90"],
        "step_p50_s": summary["step_s"]["p50"],
        "rows_per_step": summary["rows_per_step"],
        "errors": summary["errors"],
    }
    if before is not None and after is not None:
        row["captures"] = after["captures"] - before["captures"]
        row["replays"] = after["replays"] - before["replays"]
        row["eager_fallbacks"] = after["eager_fallbacks"] - before["eager_fallbacks"]
        row["eager_flow_launches"] = after["estimator_eager_launches"] - before["estimator_eager_launches"]
        # Captures inside a measured row are in its wall times (a level's new shapes are captured on
        # first use): their cost, to read the graphs-on figures against.
        row["capture_ms"] = after["capture_ms"] - before["capture_ms"]
    return row


def run_token2wav(ctx: SectionContext) -> None:
    from vllm_omni_token2wav.benchmarks.token2wav_serve.run import ServeConfig, Token2WavServeBenchmark

    sizes = SMOKE_SIZES if ctx.smoke else SIZES
    config = ServeConfig(
        model_dir=ctx.shared.get("token2wav_dir", ctx.config.model_dir),
        full=not ctx.smoke,
        device=str(ctx.device),
        concurrency=sizes.levels,
        talker_rate=INSTANT_TALKER,
        audio_seconds=sizes.audio_seconds,
        voices=1,
        n_timesteps=sizes.n_timesteps,
        reference_seconds=sizes.reference_seconds,
        max_num_seqs=sizes.max_rows,
        threads=ctx.config.threads,
        seed=ctx.config.seed,
        plan="device-check-smoke" if ctx.smoke else "device-check",
    )
    ctx.result["config"] = {k: v for k, v in vars(config).items() if k != "model_dir"}
    rows: list[dict[str, Any]] = ctx.result.setdefault("rows", [])
    stream = Token2WavServeBenchmark(config, stage=ctx.log)
    with resampler() as which:
        ctx.result["resampler"] = which
        start = time.perf_counter()
        stage = stream.build_stage(None if ctx.graph_api is FROM_PLATFORM else ctx.graph_api)
        ctx.result["graph_backend"] = (_graph_totals(stage) or {}).get("backend")
        ctx.result["graphs_available"] = stage.set_device_graphs(True)
        pool = stream.prepare(stage)  # voices and a warm-up request (graphs on: its shapes get captured)
        ctx.result["setup_s"] = time.perf_counter() - start
        ctx.flush()
        streaming_done = lambda: ctx.time_left() < sizes.whole_reserve_s  # noqa: E731
        for index, c in enumerate(sizes.levels):
            for graphs in (True, False) if index % 2 == 0 else (False, True):
                if streaming_done():
                    ctx.note(f"streaming: out of budget before c={c} graphs {'on' if graphs else 'off'}")
                    ctx.partial = True
                    break
                stage.set_device_graphs(graphs)
                before = _graph_totals(stage)
                run = stream.run_level(
                    stage, c, "batched", c, pool, should_stop=streaming_done, count=max(c, 2), label=f"g{int(graphs)}"
                )
                rows.append(_row("stream", c, graphs, run, before, _graph_totals(stage)))
                rows[-1]["memory"] = ctx.platform.memory_stats(ctx.device) if ctx.device.type != "cpu" else None
                ctx.partial |= run.stopped
                ctx.flush()
        whole = Token2WavServeBenchmark(replace(config, whole=True), stage=ctx.log)
        for c in sizes.levels:
            for graphs in (True, False):
                if ctx.out_of_time(reserve_s=2.0):
                    ctx.note(f"whole: out of budget before c={c} graphs {'on' if graphs else 'off'}")
                    break
                stage.set_device_graphs(graphs)
                before = _graph_totals(stage)
                run = whole.run_level(
                    stage, c, "batched", c, pool, should_stop=ctx.out_of_time, count=c, label=f"w{int(graphs)}"
                )
                rows.append(_row("whole", c, graphs, run, before, _graph_totals(stage)))
                ctx.flush()
    ctx.result["stage_graphs"] = _graph_totals(stage)
    ctx.shared["token2wav_stage"] = stage  # alive for the `graphs` section (its runners and memory)
    _goals(ctx, rows, full=not ctx.smoke and ctx.config.model_dir is None and sizes.n_timesteps == 10)


def _goals(ctx: SectionContext, rows: list[dict[str, Any]], *, full: bool) -> None:
    on = {r["concurrency"]: r for r in rows if r["kind"] == "stream" and r["graphs"] and not r["stopped"]}
    applies = full and ctx.device.type != "cpu"
    where = f"{'full' if full else 'reduced'} stand-in, {ctx.device}, stage graphs on"
    c1 = on.get(1)
    if c1 is not None and c1["rtf_p50"] is not None:
        value = c1["rtf_p50"]
        passed = value <= GOAL_STREAM_RTF if applies else None
        ctx.goal("token2wav_stream_rtf_c1", value, f"<= {GOAL_STREAM_RTF}", passed, where)
    top = max(on, default=None)
    if c1 is not None and top is not None and top > 1 and c1["throughput_audio_s_per_s"]:
        ratio = on[top]["throughput_audio_s_per_s"] / c1["throughput_audio_s_per_s"]
        ctx.goal(
            f"token2wav_throughput_c{top}_over_c1",
            ratio,
            f">= {GOAL_THROUGHPUT_RATIO} (at c=32)",
            ratio >= GOAL_THROUGHPUT_RATIO if applies and top == 32 else None,
            where,
        )


def render_token2wav(result: dict[str, Any]) -> list[str]:
    if not result.get("rows"):
        return ["no measurement"]
    lines = [
        f"resampler: {result.get('resampler')}; graph runtime: {result.get('graph_backend')} "
        f"(replaying: {result.get('graphs_available')}); setup {result.get('setup_s', 0.0):.1f} s",
        f"{'kind':<6} {'c':>3} {'graphs':>6} {'audio/s':>8} {'RTF p50':>8} {'RTF p90':>8} {'TTFP p50':>9} "
        f"{'step p50':>9} {'rows':>5} {'capt':>5} {'capt ms':>8} {'repl':>6}",
    ]

    def num(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    for r in result.get("rows", []):
        lines.append(
            f"{r['kind']:<6} {r['concurrency']:>3} {'on' if r['graphs'] else 'off':>6} "
            f"{num(r['throughput_audio_s_per_s'], '8.2f')} {num(r['rtf_p50'], '8.4f')} {num(r['rtf_p90'], '8.4f')} "
            f"{num(r['ttfp_p50_s'], '8.3f')}s {num(r['step_p50_s'], '8.3f')}s {num(r['rows_per_step'], '5.1f')} "
            f"{r.get('captures', '-'):>5} {num(r.get('capture_ms'), '8.0f')} {r.get('replays', '-'):>6}"
            + ("  (stopped early)" if r["stopped"] else "")
        )
    graphs = result.get("stage_graphs")
    if graphs:
        lines.append(
            f"stage graphs: {graphs['graphs']} live, {graphs['captures']} captures ({graphs['capture_ms']:.0f} ms), "
            f"{graphs['replays']} replays, {graphs['eager_fallbacks']} eager, {graphs['evictions']} evictions; "
            f"estimator keys {len(graphs['estimator_keys'])} x {graphs['estimator_segments']} segments, "
            f"HiFT keys {len(graphs['hift_keys'])}"
        )
    return lines


__all__ = [
    "GOAL_STREAM_RTF",
    "GOAL_THROUGHPUT_RATIO",
    "SIZES",
    "SMOKE_SIZES",
    "StageSizes",
    "render_stage_assets",
    "render_token2wav",
    "run_stage_assets",
    "run_token2wav",
]
