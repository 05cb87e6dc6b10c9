# SPDX-License-Identifier: Apache-2.0
"""Render the CosyVoice3 flow streaming benchmark: terminal table, JSON file, PNG plot (cost vs chunk index).

Kept apart from the measurement (`cosyvoice3_flow_stream`) so a partial report from an interrupted
run renders the same way. Files are written atomically; the plot uses an Agg canvas.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.cosyvoice3_flow_stream.run import BenchReport
from vllm_omni_token2wav.atomic_io import write_bytes_atomic
from vllm_omni_token2wav.benchmarks.common import agg_figure, fmt, png_bytes
from vllm_omni_token2wav.benchmarks.common import write_json as write_report_json


def render_text(report: BenchReport) -> str:
    cfg, env, weights = report.config, report.environment, report.weights
    lines = ["CosyVoice3 flow streaming: cost per chunk vs chunk index (cached stream vs upstream prefix re-run)"]
    if report.command:
        lines.append(f"command: {report.command}")
    if env:
        load = env.get("loadavg_start"), env.get("loadavg_end")
        load_text = " -> ".join(f"{v[0]:.2f}" for v in load if v) or "n/a"
        lines.append(f"device {env['device']} ({env['device_name']}), {env['threads']} threads, torch {env['torch']}")
        lines.append(f"cpu_count {env['cpu_count']}, loadavg (1 min) {load_text}, {env['timestamp_utc']}")
    if weights:
        c = weights["config"]
        lines.append(
            f"weights: {weights['kind']} {weights['path']} (DiT {c['depth']} x {c['dim']}, {c['heads']} heads)"
        )
    if cfg:
        lines.append(
            f"prompt {cfg['prompt_tokens']} tokens, first hop {cfg['first_hop']} then {cfg['hop_tokens']} tokens x "
            f"{cfg['chunks'] - 1}, n_timesteps {cfg['n_timesteps']}, {cfg['repeats']} repeat(s), median ms"
        )
    setup = sorted(report.setup_ms)
    if setup:
        lines.append(f"stream set-up (prompt once): {fmt(setup[len(setup) // 2], '.1f')} ms")
    lines.append("")
    lines.append(
        f"{'chunk':>5} {'history':>8} {'frames':>6} {'ours ms':>9} {'prefix ms':>10} {'ratio':>7} "
        f"{'ours cpu':>9} {'prefix cpu':>10} {'cpu ratio':>9} {'max|diff|':>9} {'cache MB':>9}"
    )
    for c in report.chunks:
        ratio = c.ratio if c.baseline_ms and c.ours_ms else None
        ours_cpu = statistics.median(c.ours_cpu_ms) if c.ours_cpu_ms else None
        base_cpu = statistics.median(c.baseline_cpu_ms) if c.baseline_cpu_ms else None
        lines.append(
            f"{c.index:>5} {c.history_frames:>8} {c.frames:>6} {fmt(c.ours_median_ms, '9.2f', '-'):>9} "
            f"{fmt(c.baseline_median_ms, '10.2f'):>10} {fmt(ratio, '7.1f'):>7} "
            f"{fmt(ours_cpu, '9.1f'):>9} {fmt(base_cpu, '10.1f'):>10} {fmt(c.cpu_ratio, '9.1f'):>9} "
            f"{fmt(c.max_abs_diff, '9.1e'):>9} {fmt(c.cache_mb, '9.1f'):>9}"
        )
    s = report.summary()
    lines.append("")
    last = report.chunks[-1].index if report.chunks else "-"
    lines.append(
        f"ours: chunk {last} / chunk 2 = {fmt(s.get('ours_last_over_reference'), '.2f')} x; "
        "prefix re-run / ours at chunk 20: "
        f"{fmt(s.get('ratio_at_20'), '.1f')} x, at chunk 50: {fmt(s.get('ratio_at_50'), '.1f')} x (wall)"
    )
    lines.append(
        f"process CPU time: ours chunk {last} / chunk 2 = {fmt(s.get('ours_cpu_last_over_reference'), '.2f')} x; "
        "prefix re-run / ours at chunk 20: "
        f"{fmt(s.get('cpu_ratio_at_20'), '.1f')} x, at chunk 50: {fmt(s.get('cpu_ratio_at_50'), '.1f')} x "
        "(the work done; robust to other processes on a busy CPU host; meaningless on an accelerator)"
    )
    lines.append(f"max |ours - prefix re-run| {fmt(s.get('max_abs_diff'), '.1e')}")
    lines.extend(render_final(s.get("final_chunk")))
    return "\n".join(lines) + "\n"


def render_final(f: dict | None) -> list[str]:  # type: ignore[type-arg]
    """The last call's cost, full attention (default, upstream's) beside block-causal, and what it adds."""
    if not f:
        return []
    share, cpu_share = f.get("adds_share_of_stream"), f.get("adds_cpu_share_of_stream")
    return [
        "",
        f"last call (once per utterance: {f['final_tokens']} tokens, ends {f['utterance_frames']} mel frames, "
        f"{f['generated_seconds']:.1f} s generated):",
        f"  full attention (default, upstream's last call) {fmt(f['full_attention_ms'], '.1f')} ms vs block-causal "
        f"{fmt(f['block_causal_ms'], '.1f')} ms wall ({fmt(f['full_over_block'], '.1f')} x); CPU "
        f"{fmt(f['full_attention_cpu_ms'], '.1f')} vs {fmt(f['block_causal_cpu_ms'], '.1f')} ms",
        f"  adds {fmt(f['adds_ms_per_utterance'], '.1f')} ms wall per utterance "
        f"({fmt(None if share is None else 100 * share, '.1f')} % of its streamed flow time "
        f"{fmt(f['stream_ms'] + f['block_causal_ms'], '.0f')} ms), {fmt(f['adds_cpu_ms_per_utterance'], '.1f')} ms "
        f"CPU ({fmt(None if cpu_share is None else 100 * cpu_share, '.1f')} %); "
        f"last chunk's mel max |full - block-causal| {fmt(f['max_abs_diff'], '.1e')}",
    ]


def write_json(report: BenchReport, path: Path) -> None:
    write_report_json(report.to_dict(), path)


def _curves(report: BenchReport, cpu: bool) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    def median(values: list[float]) -> float:
        return statistics.median(values)

    ours = [(c.index, median(c.ours_cpu_ms if cpu else c.ours_ms)) for c in report.chunks if c.ours_ms]
    base = [(c.index, median(c.baseline_cpu_ms if cpu else c.baseline_ms)) for c in report.chunks if c.baseline_ms]
    return ours, base


def write_plot(report: BenchReport, path: Path) -> None:
    fig = agg_figure(11.0, 4.2)
    for column, cpu in enumerate((False, True)):
        ax = fig.add_subplot(1, 2, column + 1)
        ours, base = _curves(report, cpu)
        if ours:
            ax.plot(*zip(*ours, strict=True), marker=".", label="cached stream (ours)")
        if base:
            ax.plot(*zip(*base, strict=True), marker="o", label="prefix re-run (upstream)")
        ax.set_xlabel("chunk index")
        ax.set_ylabel("process CPU ms per chunk (median)" if cpu else "wall ms per chunk (median)")
        final = report.final
        if ours and final.full_attention_ms and final.block_causal_ms:
            last = ours[-1][0] + 1
            pick = (
                (final.full_attention_cpu_ms, final.block_causal_cpu_ms)
                if cpu
                else (
                    final.full_attention_ms,
                    final.block_causal_ms,
                )
            )
            ax.plot([last], [statistics.median(pick[0])], marker="*", linestyle="", label="last call, full attention")
            ax.plot([last], [statistics.median(pick[1])], marker="x", linestyle="", label="last call, block-causal")
        if ours and base and max(v for _, v in base) > 20 * min(v for _, v in ours):
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend()
    cfg = report.config
    title = "CosyVoice3 flow: cost per chunk"
    if cfg:
        title += (
            f" (hop {cfg['hop_tokens']} tokens, {cfg['n_timesteps']} steps, {report.environment.get('device', '')})"
        )
    write_bytes_atomic(path, png_bytes(fig, title))
