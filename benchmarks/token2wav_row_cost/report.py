# SPDX-License-Identifier: Apache-2.0
"""Render a Token2Wav row-cost report: terminal table, JSON file and PNG plot.

Kept apart from the measurement (`token2wav_row_cost`) so an interrupted run's partial report
renders the same way. Three blocks: milliseconds per row by part for each row count (batched,
solo, solo/batched); the per-launch / per-row split of the batched launches with the ratio bounds
it implies; and, at the profiled row count, milliseconds per row by op category in both modes.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.token2wav_row_cost.run import MODES, PARTS, RowCostReport
from vllm_omni_token2wav.atomic_io import write_bytes_atomic
from vllm_omni_token2wav.benchmarks.common import agg_figure, environment_line, fmt, png_bytes
from vllm_omni_token2wav.benchmarks.common import write_json as write_report_json

_LABELS = {
    "forward": "forward (total)",
    "engine": "  engine + contract",
    "encoder": "  flow: conformer encoder",
    "estimator": "  flow: CFM estimator (+ glue)",
    "source": "  HiFT: F0 + NSF source",
    "decode": "  HiFT: conv stack + iSTFT",
    "vocoder_other": "  HiFT: glue (cross-fade, caches)",
}


def header_lines(report: RowCostReport) -> list[str]:
    cfg = report.config
    lines = [
        "token2wav stage: milliseconds per row, batched vs one request per forward "
        "(python -m benchmarks.token2wav_row_cost)"
    ]
    if report.command:
        lines.append(f"command: {report.command}")
    if report.environment:
        lines.append(environment_line(report.environment))
    if report.weights:
        lines.append(f"stage {report.weights.get('family', '?')} on {report.weights['kind']} {report.weights['path']}")
    lines.append(
        f"steady-state chunks (28 tokens, 8 + 50 mel frames), {cfg['reference_seconds']:g} s prompts, "
        f"n_timesteps {cfg['n_timesteps']}, {cfg['voices']} voices + the default; "
        f"{'thread CPU time' if cfg.get('clock') == 'cpu' else 'wall clock'}, min of {cfg['reps']} interleaved "
        "repetitions"
    )
    return lines


def part_lines(report: RowCostReport) -> list[str]:
    rows = sorted(report.per_row_ms)
    if not rows:
        return []
    head = f"{'ms per row':<34}" + "".join(f"{f'R={r} batched':>14}{'solo':>8}{'ratio':>7}" for r in rows)
    lines = [head]
    for part in PARTS:
        cells = []
        for r in rows:
            b, s = report.per_row_ms[r]["batched"][part], report.per_row_ms[r]["solo"][part]
            cells.append(f"{b:>14.2f}{s:>8.2f}{fmt(s / b if b > 0.005 else None, '.2f'):>7}")
        lines.append(f"{_LABELS[part]:<34}" + "".join(cells))
    return lines


def model_lines(report: RowCostReport) -> list[str]:
    model = report.model()
    if not model:
        return []
    lines = ["batched launch time t(R) = per_launch + per_row x R (least squares over R):"]
    for part, fit in model["parts"].items():
        lines.append(f"  {part:<8} per launch {fit['per_launch_ms']:8.2f} ms   per row {fit['per_row_ms']:7.2f} ms")
    ideal, bound = fmt(model["ideal_batched_row_ms"], ".2f"), fmt(model["ratio_bound_infinite_rows"], ".2f")
    noisy = "" if model["ideal_batched_row_ms"] is not None else " (a negative fit term: timings too noisy for a bound)"
    lines.append(
        f"  a row alone {model['solo_row_ms']:.2f} ms; ideal batching (no per-launch cost) {ideal} ms per row "
        f"-> bound x{bound}{noisy}"
    )
    measured = "  ".join(f"R={r} x{fmt(v, '.2f')}" for r, v in model["ratio_measured"].items())
    bound = "  ".join(f"R={r} x{fmt(v, '.2f')}" for r, v in model["ratio_bound"].items())
    lines.append(f"  solo/batched measured: {measured}")
    lines.append(f"  solo/batched modelled: {bound}")
    return lines


def profile_lines(report: RowCostReport) -> list[str]:
    if not report.profile_ms:
        return []
    names = list(report.profile_ms.get("solo", {}) or report.profile_ms.get("batched", {}))
    lines = [f"op categories at {report.config['profile_rows']} rows (profile shares x measured ms per row):"]
    lines.append(f"  {'category':<22}{'batched':>9}{'solo':>9}")
    for name in names:
        b = report.profile_ms.get("batched", {}).get(name, 0.0)
        s = report.profile_ms.get("solo", {}).get(name, 0.0)
        lines.append(f"  {name:<22}{b:>9.2f}{s:>9.2f}")
    return lines


def render_text(report: RowCostReport) -> str:
    parts = header_lines(report) + [""] + part_lines(report)
    for block in (model_lines(report), profile_lines(report)):
        if block:
            parts += [""] + block
    if not report.complete:
        parts += ["", "PARTIAL: the run was interrupted; the numbers above are what was measured so far"]
    return "\n".join(parts).rstrip("\n") + "\n"


def write_json(report: RowCostReport, path: Path) -> None:
    write_report_json(report.to_dict(), path)


def write_plot(report: RowCostReport, path: Path) -> None:
    """Stacked milliseconds per row by part: solo and batched bars for each row count."""
    rows = sorted(report.per_row_ms)
    fig = agg_figure(9, 4)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.38
    colours = ("#8c564b", "#2ca02c", "#1f77b4", "#ff7f0e", "#d62728", "#9467bd")
    for k, mode in enumerate(MODES[::-1]):
        xs = [i + (k - 0.5) * width for i in range(len(rows))]
        bottom = [0.0] * len(rows)
        for part, colour in zip(PARTS[1:], colours, strict=True):
            heights = [max(report.per_row_ms[r][mode][part], 0.0) for r in rows]
            ax.bar(xs, heights, width, bottom=bottom, color=colour, label=_LABELS[part].strip() if k == 0 else None)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        for x, total in zip(xs, bottom, strict=True):
            ax.annotate(mode, (x, total), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(rows)), [f"R={r}" for r in rows])
    ax.set_ylabel("ms per row")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.35)  # room for the legend above the bars
    ax.legend(fontsize=7, ncol=3, loc="upper center")
    env = report.environment
    clock = "thread CPU time" if report.config.get("clock") == "cpu" else "wall clock"
    title = f"token2wav row cost on {env.get('device', '?')}, {env.get('threads', '?')} thread(s), {clock}"
    write_bytes_atomic(path, png_bytes(fig, title))


__all__ = ["header_lines", "model_lines", "part_lines", "profile_lines", "render_text", "write_json", "write_plot"]
