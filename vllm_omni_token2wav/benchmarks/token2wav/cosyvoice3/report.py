# SPDX-License-Identifier: Apache-2.0
"""Render the CosyVoice3 code2wav benchmark: terminal table, JSON file, PNG plot (RTF and cost per chunk).

Kept apart from the measurement (`cosyvoice3/run.py`) so a partial report from an interrupted run
renders the same way. Files are written atomically; the plot uses an Agg canvas.
"""

from __future__ import annotations

import math
from pathlib import Path

from vllm_omni_token2wav.atomic_io import write_bytes_atomic
from vllm_omni_token2wav.benchmarks.common import agg_figure, environment_line, fmt, png_bytes
from vllm_omni_token2wav.benchmarks.common import write_json as write_report_json
from vllm_omni_token2wav.benchmarks.token2wav.cosyvoice3.run import BenchReport


def render_text(report: BenchReport) -> str:
    cfg, env, weights = report.config, report.environment, report.weights
    lines = ["CosyVoice3 code2wav (DiT flow + causal HiFT): RTF, first audio, cost per chunk vs chunk index"]
    if report.command:
        lines.append(f"command: {report.command}")
    if env:
        lines.append(environment_line(env))
    if weights:
        lines.append(
            f"weights: {weights['kind']} {weights['path']} ({weights['flow']}; causal HiFT "
            f"{weights['hift_base_channels']} channels); speaker embedding {weights['speaker_backend']}"
        )
    if cfg:
        lines.append(
            f"prompt {weights.get('prompt_tokens', cfg['prompt_tokens'])} tokens, {cfg['gen_seconds']:g} s generated, "
            f"n_timesteps {cfg['n_timesteps']}, {cfg['runs']} run(s) ({cfg['plan']} sizes), median ms"
        )
    lines += ["", f"{'mode':<7} {'audio s':>8} {'total ms':>10} {'RTF':>7} {'first audio ms':>15} {'chunks':>7}"]
    for m in report.modes:
        lines.append(
            f"{m.name:<7} {m.audio_seconds:>8.2f} {fmt(m.total_median_ms, '10.1f'):>10} {fmt(m.rtf, '7.3f'):>7} "
            f"{fmt(m.first_audio_median_ms, '15.1f'):>15} {m.chunks:>7}"
        )
    lines.append(
        "stream: upstream's schedule (25 + pad, 50, 100, ... tokens + 3 lookahead); first audio = set-up + first chunk"
    )
    rows = report.rows()
    if rows:
        lines += [
            "",
            f"cost per chunk: first hop {cfg['first_hop']} then {cfg['hop_tokens']} tokens; ours = cached flow chunk + "
            "bounded HiFT push; upstream = flow re-run over the prefix + HiFT re-run over all mel so far",
            f"{'chunk':>5} {'history':>7} {'flow':>8} {'hift':>7} {'ours ms':>8} {'flow':>9} {'hift':>8} "
            f"{'upstream':>9} {'ratio':>6} {'cpu ratio':>9} {'mel diff':>8} {'wav diff':>8} {'cache MB':>8}",
        ]
        for r in rows:
            lines.append(
                f"{r['index']:>5} {r['history_frames']:>7} {fmt(r['flow_ours_ms'], '8.1f'):>8} "
                f"{fmt(r['vocoder_ours_ms'], '7.1f'):>7} {fmt(r['ours_ms'], '8.1f'):>8} "
                f"{fmt(r['flow_baseline_ms'], '9.1f'):>9} {fmt(r['vocoder_baseline_ms'], '8.1f'):>8} "
                f"{fmt(r['baseline_ms'], '9.1f'):>9} {fmt(r['ratio'], '6.1f'):>6} {fmt(r['cpu_ratio'], '9.1f'):>9} "
                f"{fmt(r['mel_max_abs_diff'], '8.1e'):>8} {fmt(r['audio_max_abs_diff'], '8.1e'):>8} "
                f"{fmt(r['cache_mb'], '8.1f'):>8}"
            )
    s = report.summary()
    lines.append("")
    lines.append(
        f"upstream / ours at chunk 20: {fmt(s.get('ratio_at_20'), '.1f')} x wall, "
        f"{fmt(s.get('cpu_ratio_at_20'), '.1f')} x CPU; at chunk 50: {fmt(s.get('ratio_at_50'), '.1f')} x wall, "
        f"{fmt(s.get('cpu_ratio_at_50'), '.1f')} x CPU"
    )
    lines.append(
        f"ours, last chunk / chunk 2: {fmt(s.get('ours_last_over_chunk2'), '.2f')} x wall, "
        f"{fmt(s.get('ours_cpu_last_over_chunk2'), '.2f')} x CPU (flat = constant cost per chunk)"
    )
    lines.append(
        f"max |ours - upstream|: mel {fmt(s.get('mel_max_abs_diff'), '.1e')}, audio "
        f"{fmt(s.get('audio_max_abs_diff'), '.1e')} (audio peak {fmt(s.get('audio_peak_abs'), '.3f')})"
    )
    return "\n".join(lines) + "\n"


def write_json(report: BenchReport, path: Path) -> None:
    write_report_json(report.to_dict(), path)


def write_plot(report: BenchReport, path: Path) -> None:
    fig = agg_figure(12.0, 4.2)
    rows = [r for r in report.rows() if not math.isnan(r["ours_ms"])]
    ax = fig.add_subplot(1, 2, 1)
    if rows:
        index = [r["index"] for r in rows]
        ax.plot(index, [r["ours_ms"] for r in rows], marker=".", label="ours: cached flow + bounded HiFT")
        ax.plot(index, [r["flow_ours_ms"] for r in rows], linestyle="--", label="ours: flow part")
        base = [(r["index"], r["baseline_ms"]) for r in rows if not math.isnan(r["baseline_ms"])]
        if base:
            ax.plot(*zip(*base, strict=True), marker="o", label="upstream: prefix re-run + cumulative HiFT")
            if max(v for _, v in base) > 20 * min(r["ours_ms"] for r in rows):
                ax.set_yscale("log")
    ax.set_xlabel("chunk index")
    ax.set_ylabel("wall ms per chunk")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax = fig.add_subplot(1, 2, 2)
    names = [m.name for m in report.modes if m.total_ms]
    if names:
        ax.bar(names, [report.mode(n).rtf for n in names], color=["tab:blue", "tab:orange"][: len(names)])
        ax.axhline(1.0, color="gray", linestyle=":", label="real time")
        ax.set_ylabel("RTF (compute s / audio s)")
        ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    cfg = report.config
    title = "CosyVoice3 code2wav"
    if cfg:
        title += (
            f" ({cfg['n_timesteps']} steps, hop {cfg['hop_tokens']} tokens, {report.environment.get('device', '')})"
        )
    write_bytes_atomic(path, png_bytes(fig, title))
