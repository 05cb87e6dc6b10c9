# SPDX-License-Identifier: Apache-2.0
"""Render a Token2Wav RTF benchmark report: terminal table, JSON file and PNG plot.

Kept apart from the measurement (`token2wav_rtf`) so a partial report from an interrupted run, or a
JSON file from another machine, renders the same way. Files are written atomically and the plot is
drawn on an Agg canvas imported only when a plot is made (`vllm_omni_token2wav.benchmarks.common`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from vllm_omni_token2wav.atomic_io import write_bytes_atomic
from vllm_omni_token2wav.benchmarks.common import agg_figure, fmt, json_text, png_bytes
from vllm_omni_token2wav.benchmarks.common import write_json as write_report_json
from vllm_omni_token2wav.benchmarks.token2wav.run import COMPONENTS, BenchReport


def header_lines(report: BenchReport) -> list[str]:
    cfg, env, weights = report.config, report.environment, report.weights
    lines = ["token2wav end-to-end: RTF, first audio, component split"]
    if report.command:
        lines.append(f"command: {report.command}")
    if env:
        lines.append(f"device {env['device']} ({env['device_name']}), {env['threads']} threads, torch {env['torch']}")
        load = env.get("loadavg_start"), env.get("loadavg_end")
        load_text = " -> ".join(f"{v[0]:.2f}" for v in load if v) or "n/a"
        lines.append(f"cpu_count {env['cpu_count']}, loadavg (1 min) {load_text}, {env['timestamp_utc']}")
    if weights:
        campplus = f" (campplus.onnx: {weights['campplus']})" if weights.get("campplus") else ""
        lines.append(f"weights: {weights['kind']} {weights['path']}{campplus}")
        if "stand-in" in weights["kind"]:
            lines.append(
                "  STAND-IN: seeded random weights of the shipped geometry; costs are real, the audio is noise"
            )
    plan = {"cpu": "CPU default", "accelerator": "accelerator default", "fast": "--fast", "explicit": "explicit"}
    lines.append(
        f"generated {cfg['gen_seconds']:g} s ({cfg['gen_tokens']} tokens) + prompt {cfg['prompt_seconds']:g} s "
        f"(real speech), n_timesteps {cfg['n_timesteps']}, {cfg['runs']} run(s) + {cfg['warmup']} warm-up "
        f"[{plan.get(cfg['plan'], cfg['plan'])} sizes]"
    )
    if cfg["plan"] == "cpu":
        lines.append(
            "  (the issue's 10 s / n_timesteps 10 are the accelerator defaults; on CPU a run would take ~hour)"
        )
    if report.backends:
        b = report.backends
        lines.append(
            f"serving speaker path {b['serving_speaker']}, speech tokenizer {b['speech_tokenizer']}, "
            f"flow {b['flow_dtype']}; models loaded in {fmt(report.load_s, '.1f')} s"
        )
    return lines


def synthesis_lines(report: BenchReport) -> list[str]:
    modes = [m for m in report.modes if m.runs]
    if not modes:
        return []
    head = (
        f"{'mode':<7}{'total s':>9}{'RTF':>8}{'RTF after':>11}{'1st chunk':>11}{'1st audio':>11}"
        f"   split of the median run, s: {' / '.join(COMPONENTS)}"
    )
    sub = f"{'':<7}{'':>9}{'':>8}{'setup':>11}{'s':>11}{'s':>11}"
    lines = ["synthesis, new voice per run (prompt cache cleared); medians of the runs", head, sub]
    for m in modes:
        s = m.summary()
        split = " / ".join(fmt(s["split_of_median_run_s"][c], ".2f") for c in COMPONENTS)
        lines.append(
            f"{m.mode:<7}{s['median_total_s']:>9.2f}{s['rtf']:>8.3f}{s['rtf_after_setup']:>11.3f}"
            f"{fmt(s['median_first_chunk_s'], '.2f'):>11}{s['median_first_audio_s']:>11.2f}   {split}"
        )
    stream = report.mode("stream")
    if stream is not None and stream.runs:
        s = stream.summary()
        chunks = ", ".join(fmt(v, ".2f") for v in s["median_chunks_s"] or [])
        lines.append(f"stream: setup (set_stream_cache) {fmt(s['median_setup_s'], '.2f')} s; chunks s: {chunks}")
        parts = stream.median_run().chunk_components_s or []
        if parts:
            per_chunk = "; ".join(
                f"#{i + 1} " + " / ".join(fmt(p[c], ".2f") for c in ("flow", "vocoder", "other"))
                for i, p in enumerate(parts)
            )
            lines.append(f"stream chunks of the median run, s (flow / vocoder / other): {per_chunk}")
    return lines


def prompt_lines(report: BenchReport) -> list[str]:
    if not report.prompt_cases or not all(c.calls_ms for c in report.prompt_cases):
        return []
    ort = report.prompt_case("ort")
    lines = [
        f"prompt preparation (prepare_prompt with tokens, {report.config['prompt_seconds']:g} s prompt), "
        f"{len(report.prompt_cases[0].calls_ms)} calls each",
        f"{'case':<8}{'backend':<34}{'median ms':>10}{'p90 ms':>9}{'vs ort':>8}",
    ]
    for c in report.prompt_cases:
        ratio = c.median_ms / ort.median_ms if ort is not None else float("nan")
        lines.append(f"{c.case:<8}{c.backend:<34}{c.median_ms:>10.2f}{c.p90_ms:>9.2f}{ratio:>8.3f}")
    lines += [f"note: {n}" for n in report.notes]
    return lines


def render_text(report: BenchReport) -> str:
    parts = header_lines(report) + [""]
    for block in (synthesis_lines(report), prompt_lines(report)):
        if block:
            parts += [*block, ""]
    if not report.complete:
        parts.append("PARTIAL: the run was interrupted; the numbers above are what was measured so far")
    return "\n".join(parts).rstrip("\n") + "\n"


def report_json(report: BenchReport) -> str:
    return json_text(report.to_dict())


def write_json(report: BenchReport, path: Path) -> None:
    write_report_json(report.to_dict(), path)


_COLORS: Final = {
    "prompt": "#4c72b0",
    "flow_setup": "#8172b2",
    "flow": "#dd8452",
    "vocoder": "#55a868",
    "other": "#999999",
}


def plot_png(report: BenchReport) -> bytes:
    """PNG bytes: component split per mode, per-chunk stream latency, prompt preparation per speaker path."""
    fig = agg_figure(14, 4.5)
    split_ax, chunk_ax, prompt_ax = fig.subplots(1, 3)
    modes = [m for m in report.modes if m.runs]
    for row, m in enumerate(modes):
        s = m.summary()
        left = 0.0
        for name in COMPONENTS:
            width = s["split_of_median_run_s"][name]
            split_ax.barh(row, width, left=left, color=_COLORS[name], label=name if row == 0 else None)
            left += width
        split_ax.text(left, row, f"  RTF {s['rtf']:.2f}", va="center", fontsize=8)
    split_ax.set_yticks(range(len(modes)), [m.mode for m in modes])
    split_ax.set_xlabel("seconds (median run)")
    split_ax.set_title("where the time goes")
    if modes:
        split_ax.legend(fontsize=7, loc="lower right")
        split_ax.margins(x=0.25)
    stream = report.mode("stream")
    if stream is not None and stream.runs:
        chunks = stream.summary()["median_chunks_s"] or []
        chunk_ax.bar(range(1, len(chunks) + 1), chunks, color=_COLORS["flow"])
        chunk_ax.set_xticks(range(1, len(chunks) + 1))
        chunk_ax.axhline(1.0, color="gray", linestyle="--", linewidth=1, label="1 s = audio of a full chunk")
        chunk_ax.legend(fontsize=7)
    chunk_ax.set_xlabel("chunk (25 tokens = 1 s of audio)")
    chunk_ax.set_ylabel("seconds (median over runs)")
    chunk_ax.set_title("streaming: compute per chunk")
    cases = [c for c in report.prompt_cases if c.calls_ms]
    if cases:
        prompt_ax.bar(
            range(len(cases)), [c.median_ms for c in cases], color=["#c44e52", "#4c72b0", "#55a868"][: len(cases)]
        )
        prompt_ax.set_xticks(range(len(cases)), [f"{c.case}\n{c.backend}" for c in cases], fontsize=7)
        prompt_ax.set_yscale("log")
    prompt_ax.set_ylabel("ms per prepare_prompt (median, log)")
    prompt_ax.set_title("prompt preparation by speaker path")
    for axes in (split_ax, chunk_ax, prompt_ax):
        axes.grid(True, alpha=0.3)
    env, cfg = report.environment, report.config
    title = (
        f"token2wav on {env.get('device', '?')} ({env.get('threads', '?')} threads): "
        f"{cfg['gen_seconds']:g} s generated, n_timesteps {cfg['n_timesteps']}"
    )
    if "stand-in" in report.weights.get("kind", ""):
        title += f"  |  {report.weights['kind'].upper()}: cost only, audio is noise"
    if not report.complete:
        title += "  |  PARTIAL"
    return png_bytes(fig, title)


def write_plot(report: BenchReport, path: Path) -> None:
    write_bytes_atomic(path, plot_png(report))


__all__ = [
    "header_lines",
    "plot_png",
    "prompt_lines",
    "render_text",
    "report_json",
    "synthesis_lines",
    "write_json",
    "write_plot",
]
