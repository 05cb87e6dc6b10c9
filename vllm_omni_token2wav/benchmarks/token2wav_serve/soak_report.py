# SPDX-License-Identifier: Apache-2.0
"""Render the soak report (`--engine --soak`): terminal table, JSON file and PNG plot.

The table has one row per window of sustained requests (by send order) and one for the burst:
failures, audio seconds per wall second, TTFP p50/p99, RTF p50, the server tree's RSS when the
window's last request ended and the host's 1-minute load; then the memory summary (RSS per
phase, the least-squares slopes) and the verdict. The PNG shows RSS over time, TTFP per window
and audio s/s per window, so drift reads at a glance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_omni_token2wav.atomic_io import write_bytes_atomic
from vllm_omni_token2wav.benchmarks.common import agg_figure, environment_line, fmt, png_bytes
from vllm_omni_token2wav.benchmarks.common import write_json as write_report_json
from vllm_omni_token2wav.benchmarks.token2wav_serve.soak import SoakReport

HEAD = (
    f"{'window':<16}{'reqs':>6}{'fail':>6}{'audio s/s':>10}{'TTFP p50':>10}{'p99':>7}{'RTF p50':>9}"
    f"{'underruns':>10}{'RSS MB':>9}{'at s':>8}"
)
_PHASE_COLOURS = {"warm": "#999999", "sustained": "#1f77b4", "burst": "#d62728", "settle": "#2ca02c"}


def _load(value: Any) -> str:
    return "-" if not value else f"{value[0]:.2f}"


def header_lines(report: SoakReport) -> list[str]:
    cfg, env = report.config, report.environment
    lines = ["token2wav served stack, soak and burst (vllm-omni-token2wav bench token2wav-serve --engine --soak)"]
    if report.command:
        lines.append(f"command: {report.command}")
    if env:
        lines.append(environment_line(env))
        engine = env.get("engine") or {}
        lines.append(f"engine: {engine.get('vllm')}, {engine.get('vllm_omni')}")
    server = report.server
    if server:
        seqs = ", ".join(f"{k} {v}" for k, v in (server.get("max_num_seqs") or {}).items())
        lines.append(
            f"server: max_num_seqs {seqs or '?'}; ready after {fmt(server.get('ready_after_s'), '.0f')} s, warm-up "
            f"{fmt(server.get('warm_up_s'), '.1f')} s, {server.get('processes')} processes, RSS after warm-up "
            f"{fmt(server.get('rss_mb_after_warm_up'), '.0f')} MB"
        )
    if report.model:
        lines.append(
            f"served: stand-in producer -> {report.model['family']} code2wav ({Path(report.model['deploy']).name}), "
            f"{report.model['path']}"
        )
        lines.append("  STAND-IN: seeded random weights; costs are real, the audio is noise")
    lines.append(
        f"sustained: {cfg['requests']} streamed requests at c={cfg['concurrency']} (closed loop), then a burst of "
        f"{cfg['burst_requests']} at c={cfg['burst_concurrency']}; every reply {cfg['tokens_per_request'] / 25:g} s "
        f"({cfg['tokens_per_request']} codes), raw PCM over loopback HTTP; windows of {cfg['window']} requests by "
        f"send order; server RSS (whole process tree) every {cfg['rss_interval_s']:g} s [{cfg['plan']} plan]"
    )
    return lines


def window_lines(data: dict[str, Any]) -> list[str]:
    lines = [HEAD]
    for w in data["windows"]:
        label = f"{w['first']}-{w['last']}" if w["phase"] == "sustained" else f"burst {w['first']}-{w['last']}"
        lines.append(
            f"{label:<16}{w['finished']:>6}{w['failures']:>6}{fmt(w['throughput_audio_s_per_s'], '.2f'):>10}"
            f"{fmt(w['ttfp_s']['p50'], '.2f'):>10}{fmt(w['ttfp_s']['p99'], '.2f'):>7}{fmt(w['rtf']['p50'], '.3f'):>9}"
            f"{w['underruns']:>10}{fmt(w['rss_mb_end'], '.0f'):>9}{fmt(w['ended_s'], '.0f'):>8}"
        )
    lines.append(
        "audio s/s = whole replies' audio / (last audio - first send) of the window; TTFP = send -> first audio "
        "bytes; RSS MB = the server tree's RSS at the window's last audio; at s = since the sustained phase began"
    )
    return lines


def phase_lines(data: dict[str, Any]) -> list[str]:
    lines = []
    for phase, p in data["phases"].items():
        lines.append(
            f"{phase}: {p['finished']}/{p['requests']} requests at c={p['concurrency']}, {p['failures']} failed, "
            f"{fmt(p['throughput_audio_s_per_s'], '.2f')} audio s/s, TTFP p50 {fmt(p['ttfp_s']['p50'], '.2f')} s "
            f"p99 {fmt(p['ttfp_s']['p99'], '.2f')} s, {fmt(p.get('ended_at_s'), '.0f')} s after the start; "
            f"load {_load(p.get('loadavg_start'))} -> {_load(p.get('loadavg_end'))}"
        )
    return lines


def memory_lines(data: dict[str, Any]) -> list[str]:
    mem = data["memory"]
    parts = []
    for phase in ("warm", "sustained", "burst", "settle"):
        m = mem.get(phase)
        if m:
            parts.append(f"{phase} {m['first_mb']:.0f} -> {m['last_mb']:.0f} (peak {m['peak_mb']:.0f})")
    lines = [f"server RSS MB ({mem['samples']} samples): " + ("; ".join(parts) or "not sampled")]
    pss = [
        f"{phase} {fmt(m['pss_first_mb'], '.0f')} -> {fmt(m['pss_last_mb'], '.0f')}"
        for phase in ("warm", "sustained", "burst", "settle")
        if (m := mem.get(phase))
    ]
    if pss:
        lines.append(
            "server PSS MB (shared pages split between the processes; the RSS sum counts a shared library once per "
            f"process): {'; '.join(pss)}; sustained slope {fmt(mem['pss_slope_mb_per_min'], '+.2f')} MB/min"
        )
    growth = _growth_by_process(data["server"])
    if growth:
        lines.append("RSS MB per process, after warm-up -> after the settle: " + "; ".join(growth))
    for key, label in (("slope", "whole sustained phase"), ("slope_second_half", "its second half")):
        s = mem[key]
        lines.append(
            f"RSS slope, least squares, {label} ({s['samples']} samples over {fmt(s['span_s'], '.0f')} s): "
            f"{fmt(s['mb_per_min'], '+.2f')} MB/min, {fmt(s['mb_per_100_requests'], '+.2f')} MB per 100 requests"
        )
    return lines


def _growth_by_process(server: dict[str, Any]) -> list[str]:
    before = {p["pid"]: p for p in server.get("processes_after_warm_up") or []}
    after = server.get("processes_after_settle") or []
    out = []
    for p in after:
        was = before.get(p["pid"])
        start = "new" if was is None else f"{was['rss_mb']:.0f}"
        out.append(f"{p['name']} {start} -> {p['rss_mb']:.0f}")
    return out


def verdict_lines(data: dict[str, Any]) -> list[str]:
    v = data["verdict"]
    if v["passed"]:
        return [f"verdict: PASS (0 failures; stage errors {data['stage_errors']})"]
    return [f"verdict: FAIL ({'; '.join(v['reasons'])})"]


def render_text(report: SoakReport) -> str:
    data = report.to_dict()
    parts = header_lines(report) + [""] + window_lines(data) + [""] + phase_lines(data) + memory_lines(data)
    parts += verdict_lines(data)
    if report.notes:
        parts += [""] + [f"note: {n}" for n in report.notes]
    if not report.complete:
        parts += ["", "PARTIAL: the run was interrupted or failed; the numbers above are what was measured so far"]
    return "\n".join(parts).rstrip("\n") + "\n"


def write_json(report: SoakReport, path: Path) -> None:
    write_report_json(report.to_dict(), path)


def write_plot(report: SoakReport, path: Path) -> None:
    """RSS over time by phase; TTFP p50/p99 per window; audio s/s per window."""
    data = report.to_dict()
    fig = agg_figure(14, 4)
    axes = [fig.add_subplot(1, 3, k) for k in (1, 2, 3)]
    for phase, colour in _PHASE_COLOURS.items():
        points = [(m["t_s"] / 60.0, m["rss_mb"]) for m in data["memory_samples"] if m["phase"] == phase]
        if points:
            axes[0].plot([p[0] for p in points], [p[1] for p in points], ".-", color=colour, label=phase, ms=3)
    axes[0].set_title("server RSS (process tree)", fontsize=9)
    axes[0].set_xlabel("minutes since the sustained phase began")
    axes[0].set_ylabel("MB")
    windows = data["windows"]
    xs = list(range(len(windows)))
    labels = [str(w["last"] + 1) if w["phase"] == "sustained" else "burst" for w in windows]
    colours = [_PHASE_COLOURS[w["phase"]] for w in windows]
    p50 = [w["ttfp_s"]["p50"] or 0.0 for w in windows]
    p99 = [w["ttfp_s"]["p99"] or 0.0 for w in windows]
    axes[1].bar(xs, p50, 0.6, color=colours, label="p50")
    axes[1].scatter(xs, p99, color="black", marker="v", zorder=3, label="p99")
    axes[1].set_title("time to first audio per window", fontsize=9)
    axes[1].set_ylabel("s")
    tp = [w["throughput_audio_s_per_s"] or 0.0 for w in windows]
    axes[2].bar(xs, tp, 0.6, color=colours)
    axes[2].set_title("audio s / wall s per window", fontsize=9)
    for ax in axes[1:]:
        ax.set_xticks(xs, labels, fontsize=7, rotation=90 if len(xs) > 12 else 0)
        ax.set_xlabel("requests sent (window end)")
    for ax in axes[:2]:
        ax.legend(fontsize=7)
    env = report.environment
    load = env.get("loadavg_start"), env.get("loadavg_end")
    load_text = " -> ".join(f"{v[0]:.1f}" for v in load if v) or "n/a"
    verdict = "PASS" if data["verdict"]["passed"] else "FAIL"
    title = (
        f"token2wav-serve --engine --soak: {data['config']['requests']} at c={data['config']['concurrency']} + burst "
        f"{data['config']['burst_requests']} at c={data['config']['burst_concurrency']}, {verdict}, "
        f"{env.get('cpu', '?')} (load {load_text})"
    )
    write_bytes_atomic(path, png_bytes(fig, title))


__all__ = ["header_lines", "render_text", "window_lines", "write_json", "write_plot"]
