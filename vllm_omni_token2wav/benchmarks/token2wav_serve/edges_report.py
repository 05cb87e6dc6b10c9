# SPDX-License-Identifier: Apache-2.0
"""The table, JSON and PNG of `bench token2wav-serve --engine --edge` (`edges.py` beside this module)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_omni_token2wav.atomic_io import write_bytes_atomic
from vllm_omni_token2wav.benchmarks.common import agg_figure, environment_line, fmt, png_bytes
from vllm_omni_token2wav.benchmarks.common import write_json as write_report_json
from vllm_omni_token2wav.benchmarks.token2wav_serve.edges import TRANSFER_TARGET_MS, TTFP_TARGET, EdgeReport

_EDGE_NAMES = {"shm": "SharedMemory", "mooncake": "Mooncake TE (tcp)"}
_COLOURS = {"shm": "#1f77b4", "mooncake": "#ff7f0e"}


def _ms(p: dict[str, Any], key: str) -> str:
    return f"{fmt(p.get('p50'), '.2f')}/{fmt(p.get(key), '.2f')}"


def _miss(t: dict[str, Any]) -> str:
    return f"{fmt((t.get('miss_ms') or {}).get('p50'), '.2f')}/{fmt(t.get('miss_ms_total'), '.0f')}"


def table_lines(report: EdgeReport) -> list[str]:
    head = (
        f"{'edge':<18} {'c':>3} {'req':>4} {'fail':>4} {'TTFP p50/p99 s':>15} {'audio s/s':>9} {'chunks':>6} "
        f"{'put ms p50/p99':>15} {'get ms p50/p99':>15} {'xfer ms p50/p99':>16} {'hand-off ms p50/p99':>20} "
        f"{'misses':>6} {'miss ms p50/sum':>16} {'cpu s/audio s':>13}"
    )
    lines = [head, "-" * len(head)]
    for level in report.levels:
        s = level.summary()
        t = s["transfers"]
        ttfp = s["ttfp_s"]
        lines.append(
            f"{_EDGE_NAMES[s['edge']]:<18} {s['concurrency']:>3} {s['requests']:>4} {len(s['failures']):>4} "
            f"{fmt(ttfp['p50'], '.3f') + '/' + fmt(ttfp['p99'], '.3f'):>15} "
            f"{fmt(s['throughput_audio_s_per_s'], '.2f'):>9} {t['chunks']:>6} {_ms(t['put_ms'], 'p99'):>15} "
            f"{_ms(t['get_ms'], 'p99'):>15} {_ms(t['transfer_ms'], 'p99'):>16} {_ms(t['handoff_ms'], 'p99'):>20} "
            f"{t.get('misses', 0):>6} {_miss(t):>16} {fmt(s.get('server_cpu_s_per_audio_s'), '.3f'):>13}"
        )
    return lines


def target_lines(report: EdgeReport) -> list[str]:
    t = report.targets()
    if t is None:
        return ["targets: need both edges at one level"]
    transfer = "met" if t["transfer_met"] else "NOT met"
    ttfp = "met" if t["ttfp_met"] else "NOT met"
    ratio = t["ttfp_p50_ratio"]
    return [
        f"targets at c={t['concurrency']} (issue 35): Mooncake transfer p50 {fmt(t['transfer_p50_ms'], '.2f')} ms "
        f"<= {TRANSFER_TARGET_MS:g} ms: {transfer}; TTFP p50 Mooncake / SharedMemory "
        f"{fmt(ratio, '.3f')} <= {1 + TTFP_TARGET:.2f}: {ttfp}"
    ]


def render_text(report: EdgeReport) -> str:
    cfg = report.config
    parts = [
        "token2wav-serve --engine --edge: the code2wav edge, SharedMemory vs Mooncake TE, one engine on loopback",
        environment_line(report.environment) if report.environment else "host: not recorded (the run stopped early)",
        f"stack: {report.model.get('deploy', '?')} (stand-in producer -> our Step-Audio2 code2wav), "
        f"{cfg.audio_seconds:g} s replies ({cfg.tokens} codes), closed loop; server start-up "
        + ", ".join(f"{e} {s:.0f} s" for e, s in report.startup_s.items())
        + "; idle server CPU (cores) "
        + ", ".join(f"{e} {v:.2f}" for e, v in report.idle_cores.items()),
        "xfer = put + get of one chunk (serialise/store + fetch/deserialise, timed in the engine processes); "
        "hand-off = put start to get end (the transfer plus the receiver's polling wait); misses = the receiver's "
        "gets that found no chunk yet (their ms p50 and sum: time its scheduler spent polling); cpu s/audio s = the "
        "server process tree's CPU seconds per audio second served",
        "",
        *table_lines(report),
        "",
        *target_lines(report),
    ]
    for level in report.levels:
        for failure in level.failures()[:3]:
            parts.append(f"FAILED {level.edge} c={level.concurrency}: {failure}")
    if report.notes:
        parts += [""] + [f"note: {n}" for n in report.notes]
    if not report.complete:
        parts += ["", "PARTIAL: the run was interrupted or failed; the numbers above are what was measured so far"]
    return "\n".join(parts).rstrip("\n") + "\n"


def write_json(report: EdgeReport, path: Path) -> None:
    write_report_json(report.to_dict(), path)


def write_plot(report: EdgeReport, path: Path) -> None:
    """Per level and edge: TTFP p50 (p99 marked), audio s/s, and the chunk transfer / hand-off p50."""
    levels = [lv.summary() for lv in report.levels]
    conc = list(report.config.concurrency)
    fig = agg_figure(13, 4)
    axes = [fig.add_subplot(1, 3, k) for k in (1, 2, 3)]
    edges = [e for e in report.config.edges if any(lv["edge"] == e for lv in levels)]
    width = 0.8 / max(1, len(edges))
    for k, edge in enumerate(edges):
        by_c = {lv["concurrency"]: lv for lv in levels if lv["edge"] == edge}
        xs = [i + (k - (len(edges) - 1) / 2) * width for i in range(len(conc))]
        rows = [by_c.get(c) for c in conc]
        colour, name = _COLOURS[edge], _EDGE_NAMES[edge]
        axes[0].bar(xs, [(r or {}).get("ttfp_s", {}).get("p50") or 0.0 for r in rows], width, color=colour, label=name)
        axes[0].scatter(
            xs, [(r or {}).get("ttfp_s", {}).get("p99") or 0.0 for r in rows], color=colour, marker="v", zorder=3
        )
        axes[1].bar(
            xs, [(r or {}).get("throughput_audio_s_per_s") or 0.0 for r in rows], width, color=colour, label=name
        )
        xfer = [((r or {}).get("transfers", {}).get("transfer_ms") or {}).get("p50") or 0.0 for r in rows]
        hand = [((r or {}).get("transfers", {}).get("handoff_ms") or {}).get("p50") or 0.0 for r in rows]
        axes[2].bar(xs, xfer, width, color=colour, label=f"{name} transfer")
        axes[2].scatter(xs, hand, color=colour, marker="o", zorder=3, edgecolors="black", linewidths=0.5)
    axes[2].axhline(TRANSFER_TARGET_MS, color="grey", linestyle="--", linewidth=0.8)
    titles = (
        ("time to first audio p50 (p99: triangles)", "s"),
        ("throughput", "audio s / wall s"),
        ("per-chunk transfer p50 (hand-off: dots)", "ms"),
    )
    for ax, (title, unit) in zip(axes, titles, strict=True):
        ax.set_xticks(list(range(len(conc))), [f"c={c}" for c in conc])
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(unit)
        ax.legend(fontsize=7)
    title = f"token2wav-serve --engine --edge: SharedMemory vs Mooncake TE, {report.environment.get('cpu', '?')}"
    write_bytes_atomic(path, png_bytes(fig, title))


__all__ = ["render_text", "table_lines", "target_lines", "write_json", "write_plot"]
