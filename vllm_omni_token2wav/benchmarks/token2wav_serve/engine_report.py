# SPDX-License-Identifier: Apache-2.0
"""Render the served (`--engine`) concurrency report: terminal table, JSON file and PNG plot.

The table keeps the emulated report's columns (`token2wav_serve_report.COMMON_HEAD`: throughput,
TTFP, RTF, underruns, stalls, steps, rows per step) so the two read side by side, and adds what
only the served run has: the stage's forward time per step inside the engine (`fwd ms`), what
in-process steps with the same rows take (`in-proc ms`), their ratio (`x in-proc`), the share of
wall time the stage spent in `forward` (`busy`), the producer's measured rate (`talker/s`) and the
host's 1-minute load around the run. Per level: the two servers, their ratio, the in-process run
of the same work in both modes, and the engine / in-process ratio of the batched mode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_omni_token2wav.atomic_io import write_bytes_atomic
from vllm_omni_token2wav.benchmarks.common import agg_figure, environment_line, fmt, png_bytes
from vllm_omni_token2wav.benchmarks.common import write_json as write_report_json
from vllm_omni_token2wav.benchmarks.token2wav_serve.engine import EngineServeReport
from vllm_omni_token2wav.benchmarks.token2wav_serve.report import COMMON_HEAD, mode_cells, ratio_cells, row_label
from vllm_omni_token2wav.benchmarks.token2wav_serve.run import MODES

_LABEL = 16
_NAMES = {
    ("engine", "batched"): "engine batched",
    ("engine", "unbatched"): "engine mns=1",
    ("in_process", "batched"): "in-proc batched",
    ("in_process", "unbatched"): "in-proc 1/fwd",
}
TAIL_HEAD = (
    f"{'fwd ms':>8}{'cpu ms':>8}{'in-proc ms':>11}{'x in-proc':>10}{'x cpu':>7}{'busy':>6}{'talker/s':>9}{'load':>10}"
)


def header_lines(report: EngineServeReport) -> list[str]:
    cfg, env = report.config, report.environment
    lines = ["token2wav served stack under concurrent load (vllm-omni-token2wav bench token2wav-serve --engine)"]
    if report.command:
        lines.append(f"command: {report.command}")
    if env:
        lines.append(environment_line(env))
        engine = env.get("engine") or {}
        lines.append(
            f"engine: {engine.get('vllm')}, {engine.get('vllm_omni')}; "
            f"VLLM_CPU_OMP_THREADS_BIND={engine.get('omp_threads_bind')}"
        )
    for mode, info in report.servers.items():
        binding = info.get("cpu_binding") or {}
        cores = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in binding.items()) or "not logged"
        lines.append(
            f"server {_NAMES[('engine', mode)]} (code2wav max_num_seqs {info['code2wav_max_num_seqs']}): ready after "
            f"{info['ready_after_s']:.0f} s, warm-up {fmt(info.get('warm_up_s'), '.1f')} s, worker torch threads "
            f"{info.get('torch_threads')}, OpenMP cores: {cores}"
        )
    if report.model:
        lines.append(
            f"served: stand-in producer -> {report.model['family']} code2wav ({Path(report.model['deploy']).name}), "
            f"{report.model['path']}"
        )
        lines.append("  STAND-IN: seeded random weights; costs are real, the audio is noise")
    arrival = "closed loop" if cfg["request_rate"] is None else f"Poisson {cfg['request_rate']:g} req/s"
    lines.append(
        f"{arrival}; every reply {cfg['tokens_per_request'] / 25:g} s ({cfg['tokens_per_request']} codes, 25 + 3 token "
        f"chunks), default voice; raw PCM streamed over loopback HTTP [{cfg['plan']} plan]"
    )
    inproc = report.in_process.report.config if report.in_process is not None else {}
    clock = inproc.get("clock", cfg.get("in_process_clock"))
    clock_text = "the thread's CPU time (a core of its own)" if clock == "cpu" else "the wall clock"
    lines.append(
        "in-proc rows: the emulated benchmark on the same stand-in folder, codes, chunking and arrivals, its talker "
        f"at the producer rate measured on the batched server at that level (run after the servers stopped); "
        f"its steps timed by {clock_text}"
    )
    return lines


def _load(m: dict[str, Any]) -> str:
    load = m.get("loadavg") or {}
    start, end = load.get("start"), load.get("end")
    return f"{start[0]:.1f}-{end[0]:.1f}" if start and end else "-"


def _served_tail(m: dict[str, Any]) -> str:
    eng = m["engine"]
    vs = eng.get("vs_in_process") or {}
    talker = (m.get("talker") or {}).get("codes_per_s") or {}
    return (
        f"{fmt(eng['forward_ms_per_step'], '.1f'):>8}{fmt(eng.get('forward_cpu_ms_per_step'), '.1f'):>8}"
        f"{fmt(vs.get('in_process_ms_per_step'), '.1f'):>11}{fmt(vs.get('ratio'), '.2f'):>10}"
        f"{fmt(vs.get('cpu_ratio'), '.2f'):>7}{fmt(eng['busy'], '.2f'):>6}{fmt(talker.get('p50'), '.0f'):>9}"
        f"{_load(m):>10}"
    )


def _in_process_tail(m: dict[str, Any], level: dict[str, Any]) -> str:
    mean = (m.get("step_s") or {}).get("mean")
    busy = mean * m["steps"] / m["makespan_s"] if mean is not None and m.get("makespan_s") else None
    return (
        f"{fmt(None if mean is None else 1e3 * mean, '.1f'):>8}{'':>8}{'':>11}{'':>10}{'':>7}{fmt(busy, '.2f'):>6}"
        f"{fmt(level.get('talker_rate'), '.0f'):>9}{_load(level):>10}"
    )


def level_lines(report: EngineServeReport) -> list[str]:
    data = report.to_dict()["levels"]
    if not data:
        return []
    lines = [f"{'c':>3} {'mode':<{_LABEL}}{COMMON_HEAD}{TAIL_HEAD}"]
    for level in data:
        c = level["concurrency"]
        for mode in MODES:
            m = level["modes"].get(mode)
            if m is not None:
                lines.append(f"{row_label(c, _NAMES[('engine', mode)], _LABEL)}{mode_cells(m)}{_served_tail(m)}")
        ratio = level.get("ratio_batched_over_unbatched")
        if ratio:
            lines.append(f"{row_label(c, 'ratio b/mns=1', _LABEL)}{ratio_cells(ratio)}")
        inproc = level.get("in_process")
        if inproc:
            for mode in MODES:
                m = inproc["modes"].get(mode)
                if m is not None:
                    label = row_label(c, _NAMES[("in_process", mode)], _LABEL)
                    lines.append(f"{label}{mode_cells(m)}{_in_process_tail(m, inproc)}")
            if inproc.get("ratio_batched_over_unbatched"):
                lines.append(
                    f"{row_label(c, 'in-proc ratio', _LABEL)}{ratio_cells(inproc['ratio_batched_over_unbatched'])}"
                )
        versus = (level.get("engine_over_in_process") or {}).get("batched")
        if versus:
            lines.append(f"{row_label(c, 'engine/in-proc b', _LABEL)}{ratio_cells(versus)}")
    lines += [
        "ratio b/mns=1 = engine batched / engine max_num_seqs=1; in-proc ratio = batched / one request per forward; "
        "engine/in-proc b = engine batched / in-proc batched",
        "  (audio s/s above 1 and latencies below 1 favour the numerator)",
        "fwd ms = the stage's time inside forward per step (engine: the worker's wall clock; in-proc: the emulated "
        "steps, by the in-process clock); cpu ms = the engine worker thread's CPU time in forward; in-proc ms = "
        "in-process steps with the same rows (measured, or linear in rows between measured counts), weighted by "
        "the engine's step mix; x in-proc = fwd ms / in-proc ms; x cpu = cpu ms / in-proc ms",
        "busy = forward time / wall time of the level; talker/s = producer codes/s (engine: 1000/TPOT from vLLM-Omni's "
        "per-request log, p50; in-proc: the emulated talker, set to it); load = 1-min load average before-after",
    ]
    return lines


def render_text(report: EngineServeReport) -> str:
    parts = header_lines(report) + [""] + level_lines(report)
    if report.notes:
        parts += [""] + [f"note: {n}" for n in report.notes]
    if not report.complete:
        parts += ["", "PARTIAL: the run was interrupted or failed; the numbers above are what was measured so far"]
    return "\n".join(parts).rstrip("\n") + "\n"


def write_json(report: EngineServeReport, path: Path) -> None:
    write_report_json(report.to_dict(), path)


def _series(levels: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any] | None]]]:
    out = []
    for source, mode in _NAMES:
        if source == "engine":
            values = [lv["modes"].get(mode) for lv in levels]
        else:
            values = [(lv.get("in_process") or {}).get("modes", {}).get(mode) for lv in levels]
        if any(v is not None for v in values):
            out.append((_NAMES[(source, mode)], values))
    return out


def write_plot(report: EngineServeReport, path: Path) -> None:
    """Per level: audio s/s, TTFP p50 (p90 marked), and forward ms per step, for each served and in-process mode."""
    levels = report.to_dict()["levels"]
    fig = agg_figure(13, 4)
    axes = [fig.add_subplot(1, 3, k) for k in (1, 2, 3)]
    series = _series(levels)
    xs = list(range(len(levels)))
    width = 0.8 / max(1, len(series))
    colours = ["#1f77b4", "#ff7f0e", "#9ecae1", "#fdd0a2"]
    for k, (name, values) in enumerate(series):
        offs = [x + (k - (len(series) - 1) / 2) * width for x in xs]
        colour = colours[k % len(colours)]
        tp = [(v or {}).get("throughput_audio_s_per_s") or 0.0 for v in values]
        axes[0].bar(offs, tp, width, color=colour, label=name)
        p50 = [((v or {}).get("ttfp_s") or {}).get("p50") or 0.0 for v in values]
        p90 = [((v or {}).get("ttfp_s") or {}).get("p90") or 0.0 for v in values]
        axes[1].bar(offs, p50, width, color=colour, label=f"{name} p50")
        axes[1].scatter(offs, p90, color=colour, marker="v", zorder=3, edgecolors="black", linewidths=0.5)
        fwd = []
        for v in values:
            if v is None:
                fwd.append(0.0)
            elif "engine" in v:
                fwd.append(v["engine"].get("forward_ms_per_step") or 0.0)
            else:
                fwd.append(1e3 * ((v.get("step_s") or {}).get("mean") or 0.0))
        axes[2].bar(offs, fwd, width, color=colour, label=name)
    labels = [f"c={lv['concurrency']}" for lv in levels]
    titles = (
        ("throughput", "audio s / wall s"),
        ("time to first audio (p90: triangles)", "s"),
        ("stage forward per step", "ms"),
    )
    for ax, (title, unit) in zip(axes, titles, strict=True):
        ax.set_xticks(xs, labels)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(unit)
        ax.legend(fontsize=7)
    env = report.environment
    load = env.get("loadavg_start"), env.get("loadavg_end")
    load_text = " -> ".join(f"{v[0]:.1f}" for v in load if v) or "n/a"
    title = f"token2wav-serve --engine: served stand-in stack vs in-process, {env.get('cpu', '?')} (load {load_text})"
    write_bytes_atomic(path, png_bytes(fig, title))


__all__ = ["header_lines", "level_lines", "render_text", "write_json", "write_plot"]
