# SPDX-License-Identifier: Apache-2.0
"""Render a Token2Wav concurrency report: terminal table, JSON file and PNG plot.

Kept apart from the measurement (`token2wav_serve`) so a partial report from an interrupted run
renders the same way. The table has, per concurrency level, one row per mode and a ratio row
(batched / one-request-per-forward): a throughput ratio above 1 and latency ratios below 1 mean
batching helps. Files are written atomically; the plot is drawn on an Agg canvas.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_omni_token2wav.atomic_io import write_bytes_atomic
from vllm_omni_token2wav.benchmarks.common import agg_figure, environment_line, fmt, png_bytes
from vllm_omni_token2wav.benchmarks.common import write_json as write_report_json
from vllm_omni_token2wav.benchmarks.token2wav_serve.run import MODES, ServeReport

_MB = 1_000_000  # decimal megabytes


def _p(block: dict[str, Any] | None, key: str, spec: str = ".2f") -> str:
    return fmt(None if block is None else block.get(key), spec)


def header_lines(report: ServeReport) -> list[str]:
    cfg, env, weights = report.config, report.environment, report.weights
    lines = ["token2wav stage under concurrent load (vllm-omni-token2wav bench token2wav-serve)"]
    if report.command:
        lines.append(f"command: {report.command}")
    if env:
        lines.append(environment_line(env))
    if weights:
        lines.append(f"stage {weights.get('family', '?')} on {weights['kind']} {weights['path']}")
        if "stand-in" in weights["kind"]:
            lines.append("  STAND-IN: seeded random weights; costs are real, the audio is noise")
    arrival = "closed loop" if cfg["request_rate"] is None else f"Poisson {cfg['request_rate']:g} req/s"
    lo, hi = cfg["audio_seconds"]
    lines.append(
        f"{arrival}; talker {cfg['talker_rate']:g} codes/s per request ({cfg['talker_rate'] / 25:g}x real time); "
        f"requests of {lo:g}-{hi:g} s audio, 25 + 3 token chunks; {cfg['voices']} reference voices + the default; "
        f"n_timesteps {cfg['n_timesteps']}; {cfg['reference_seconds']:g} s prompts [{cfg['plan']} plan]"
    )
    if cfg.get("clock", "wall") == "cpu":
        lines.append("step clock: the thread's CPU time (1 thread; time other processes held the core excluded)")
    if report.setup_s:
        lines.append(
            "setup (untimed): "
            + ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.1f} s" for k, v in report.setup_s.items())
        )
    return lines


#: The columns every concurrency table shares (this one and the served run's, `engine_report`).
COMMON_HEAD = (
    f"{'audio s/s':>10}{'TTFP p50':>10}{'p90':>7}{'p99':>7}{'RTF p50':>9}{'p90':>7}{'p99':>7}"
    f"{'underruns':>10}{'stall p90':>10}{'steps':>7}{'rows/step':>10}"
)


def row_label(c: int, name: str, width: int = 10) -> str:
    return f"{c:>3} {name:<{width}}"


def mode_cells(m: dict[str, Any]) -> str:
    """The shared columns of one mode's summary (`ModeRun.summary()`), under `COMMON_HEAD`."""
    steps = m.get("steps")
    return (
        f"{fmt(m['throughput_audio_s_per_s'], '.2f'):>10}"
        f"{_p(m['ttfp_s'], 'p50'):>10}{_p(m['ttfp_s'], 'p90'):>7}{_p(m['ttfp_s'], 'p99'):>7}"
        f"{_p(m['rtf'], 'p50', '.3f'):>9}{_p(m['rtf'], 'p90', '.3f'):>7}{_p(m['rtf'], 'p99', '.3f'):>7}"
        f"{m['underruns']:>10d}{_p(m['stall_s'], 'p90'):>10}{'-' if steps is None else steps:>7}"
        f"{fmt(m.get('rows_per_step'), '.2f'):>10}"
    )


def ratio_cells(ratio: dict[str, Any]) -> str:
    """A ratio row's cells under `COMMON_HEAD` (`token2wav_serve.ratio_row`: throughput, TTFP, RTF, stall)."""
    return (
        f"{fmt(ratio['throughput_audio_s_per_s'], '.2f'):>10}"
        f"{fmt(ratio['ttfp_s_p50'], '.2f'):>10}{fmt(ratio['ttfp_s_p90'], '.2f'):>7}{'':>7}"
        f"{fmt(ratio['rtf_p50'], '.2f'):>9}{fmt(ratio['rtf_p90'], '.2f'):>7}{'':>7}{'':>10}"
        f"{fmt(ratio['stall_s_p90'], '.2f'):>10}"
    )


def level_lines(report: ServeReport) -> list[str]:
    data = report.to_dict()["levels"]
    if not data:
        return []
    lines = [f"{'c':>3} {'mode':<10}{COMMON_HEAD}{'step p50':>9}{'MB/stream':>10}"]
    for level in data:
        c = level["concurrency"]
        for mode in MODES:
            m = level["modes"].get(mode)
            if m is None:
                continue
            name = "batched" if mode == "batched" else "1-per-fwd"
            lines.append(
                f"{row_label(c, name)}{mode_cells(m)}{_p(m['step_s'], 'p50', '.3f'):>9}"
                f"{m['peak_stream_own_bytes'] / _MB:>10.1f}"
            )
        ratio = level.get("ratio_batched_over_unbatched")
        if ratio:
            lines.append(f"{row_label(c, 'ratio')}{ratio_cells(ratio)}")
        bound = level.get("talker_bound_audio_s_per_s")
        if bound:
            lines.append(f"{row_label(c, 'talker')}{bound:>10.2f}  <- most audio s/s the talkers produce (either mode)")
    lines.append(
        "ratio = batched / one-request-per-forward: audio s/s above 1 and latencies below 1 mean batching helps; "
        "MB/stream = largest own (unshared) cache of a live stream"
    )
    return lines


def render_text(report: ServeReport) -> str:
    parts = header_lines(report) + [""] + level_lines(report)
    if report.notes:
        parts += [""] + [f"note: {n}" for n in report.notes]
    if not report.complete:
        parts += ["", "PARTIAL: the run was interrupted; the numbers above are what was measured so far"]
    return "\n".join(parts).rstrip("\n") + "\n"


def write_json(report: ServeReport, path: Path) -> None:
    write_report_json(report.to_dict(), path)


def write_plot(report: ServeReport, path: Path) -> None:
    """Two panels per concurrency level: audio seconds per wall second, and TTFP p50/p90, by mode."""
    levels = report.to_dict()["levels"]
    fig = agg_figure(10, 4)
    ax_tp, ax_ttfp = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    xs = list(range(len(levels)))
    width = 0.38
    colours = {"batched": "#1f77b4", "unbatched": "#ff7f0e"}
    for k, mode in enumerate(MODES):
        offs = [x + (k - 0.5) * width for x in xs]
        tp = [(lv["modes"].get(mode) or {}).get("throughput_audio_s_per_s") or 0.0 for lv in levels]
        bars = ax_tp.bar(offs, tp, width, label="batched" if mode == "batched" else "1 request / forward")
        for bar, level in zip(bars, levels, strict=True):
            bar.set_color(colours[mode])
            ratio = (level.get("ratio_batched_over_unbatched") or {}).get("throughput_audio_s_per_s")
            if mode == "batched" and ratio:
                ax_tp.annotate(f"x{ratio:.2f}", (bar.get_x() + width, bar.get_height()), ha="center", va="bottom")
        p50 = [((lv["modes"].get(mode) or {}).get("ttfp_s") or {}).get("p50") or 0.0 for lv in levels]
        p90 = [((lv["modes"].get(mode) or {}).get("ttfp_s") or {}).get("p90") or 0.0 for lv in levels]
        ax_ttfp.bar(offs, p50, width, color=colours[mode], label=f"{mode} p50")
        ax_ttfp.scatter(offs, p90, color=colours[mode], marker="v", zorder=3, label=f"{mode} p90")
    labels = [f"c={lv['concurrency']}" for lv in levels]
    for ax, title, unit in ((ax_tp, "throughput", "audio s / wall s"), (ax_ttfp, "time to first audio", "s")):
        ax.set_xticks(xs, labels)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(unit)
        ax.legend(fontsize=7)
    env = report.environment
    title = (
        f"token2wav-serve on {env.get('device', '?')} ({env.get('threads', '?')} threads), "
        f"{report.weights.get('kind', '')}"
    )
    write_bytes_atomic(path, png_bytes(fig, title))


__all__ = [
    "COMMON_HEAD",
    "header_lines",
    "level_lines",
    "mode_cells",
    "ratio_cells",
    "render_text",
    "row_label",
    "write_json",
    "write_plot",
]
