# SPDX-License-Identifier: Apache-2.0
"""Render a causal-HiFT streaming benchmark report: terminal table, JSON file and PNG plot.

Kept apart from the measurement (`causal_hift_stream`) so a partial report from an interrupted run
renders the same way. Files are written atomically; the plot is drawn on an Agg canvas.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.causal_hift_stream.run import RATIO_AT, StreamBenchReport
from vllm_omni_token2wav.atomic_io import write_bytes_atomic
from vllm_omni_token2wav.benchmarks.common import agg_figure, environment_line, fmt, png_bytes
from vllm_omni_token2wav.benchmarks.common import write_json as write_report_json

SHOWN_CHUNKS = (1, 2, 5, 10, 20, 30, 40, 50)


def header_lines(report: StreamBenchReport) -> list[str]:
    cfg, env, weights = report.config, report.environment, report.weights
    lines = ["causal HiFT streaming: cost per chunk, bounded state vs upstream cumulative re-run"]
    if report.command:
        lines.append(f"command: {report.command}")
    if env:
        lines.append(environment_line(env))
    if weights:
        lines.append(f"weights: {weights['kind']}, {weights['parameters']:,} parameters ({weights['path']})")
    seconds = cfg["chunks"] * cfg["chunk_frames"] * 480 / 24000
    lines.append(
        f"{cfg['chunks']} chunks x {cfg['chunk_frames']} mel frames ({seconds:g} s of audio), "
        f"{cfg['runs']} run(s) after {cfg['warmup_chunks']} warm-up chunk(s); medians per chunk index"
    )
    return lines


def chunk_lines(report: StreamBenchReport) -> list[str]:
    bounded, cumulative = report.median_chunk_ms("bounded"), report.median_chunk_ms("cumulative")
    if not bounded:
        return []
    shown = [k for k in SHOWN_CHUNKS if k <= len(bounded)]
    if len(bounded) not in shown:
        shown.append(len(bounded))
    lines = [f"{'chunk':>6}{'bounded ms':>12}{'cumulative ms':>15}{'ratio':>8}"]
    for k in shown:
        b = bounded[k - 1]
        c = cumulative[k - 1] if len(cumulative) >= k else None
        ratio = c / b if c is not None and b > 0 else None
        lines.append(f"{k:>6}{b:>12.1f}{fmt(c, '.1f'):>15}{fmt(ratio, '.2f'):>8}")
    return lines


def summary_lines(report: StreamBenchReport) -> list[str]:
    s = report.summary()
    ratios = ", ".join(f"chunk {k}: {fmt(s['ratio_cumulative_over_bounded'][str(k)], '.2f')}" for k in RATIO_AT)
    lines = [f"cumulative / bounded time per chunk: {ratios}"]
    for mode in ("bounded", "cumulative"):
        m = s[mode]
        lines.append(
            f"{mode:<11} first chunk {fmt(m['first_chunk_ms'], '.1f')} ms, last {fmt(m['last_chunk_ms'], '.1f')} ms, "
            f"all chunks {fmt(m['total_ms'], '.0f')} ms, streaming RTF {fmt(m['rtf'], '.3f')}"
        )
    lines.append(f"whole-utterance inference (one call): {fmt(s['whole_utterance_ms'], '.0f')} ms")
    if report.max_abs_diff is not None:
        peak = fmt(report.peak_abs, ".3f")
        lines.append(f"audio of the two streams: max |diff| {report.max_abs_diff:.2e} (peak |audio| {peak})")
    return lines


def render_text(report: StreamBenchReport) -> str:
    parts = header_lines(report) + [""]
    for block in (chunk_lines(report), summary_lines(report)):
        if block:
            parts += [*block, ""]
    if not report.complete:
        parts.append("PARTIAL: the run was interrupted; the numbers above are what was measured so far")
    return "\n".join(parts).rstrip("\n") + "\n"


def write_json(report: StreamBenchReport, path: Path) -> None:
    write_report_json(report.to_dict(), path)


def write_plot(report: StreamBenchReport, path: Path) -> None:
    fig = agg_figure(8.0, 4.5)
    ax = fig.add_subplot(1, 1, 1)
    for mode, style in (("cumulative", "o-"), ("bounded", "s-")):
        medians = report.median_chunk_ms(mode)
        if medians:
            label = "upstream cumulative re-run" if mode == "cumulative" else "bounded state (CausalHiFTStreamer)"
            ax.plot(range(1, len(medians) + 1), medians, style, markersize=3, label=label)
    for k in RATIO_AT:
        ratio = report.ratio_at(k)
        if ratio is not None:
            ax.axvline(k, color="grey", linewidth=0.6, linestyle=":")
            ax.annotate(f"x{ratio:.1f}", (k, report.median_chunk_ms("cumulative")[k - 1]), fontsize=8)
    ax.set_xlabel("chunk index")
    ax.set_ylabel("ms per chunk (median)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    env = report.environment
    title = f"causal HiFT, {report.config['chunk_frames']}-frame chunks, {report.weights.get('kind', '')}"
    if env:
        threads = env["threads"]
        title += f"\n{env['device_name']}, {threads} thread{'s' if threads != 1 else ''}"
    write_bytes_atomic(path, png_bytes(fig, title))
