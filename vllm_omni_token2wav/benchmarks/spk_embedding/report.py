# SPDX-License-Identifier: Apache-2.0
"""Render a speaker-embedding benchmark report: terminal table, JSON file and PNG plot.

Kept apart from the measurement (`spk_embedding`) so a partial report from an interrupted run, or a
JSON file from another machine, renders the same way. Files are written atomically (tmp file in the
target folder + `os.replace`), so a reader never sees half a report. matplotlib is imported only
when a plot is written, and only through its Agg canvas (no pyplot, no global backend switch).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from vllm_omni_token2wav.atomic_io import write_bytes_atomic
from vllm_omni_token2wav.benchmarks.common import agg_figure, fmt, json_text, png_bytes
from vllm_omni_token2wav.benchmarks.common import write_json as write_report_json
from vllm_omni_token2wav.benchmarks.spk_embedding.run import LONG_FRAMES, BenchReport, CellResult, speed_verdicts

_BACKEND_ORDER = {"ort": 0, "torch": 1, "trt": 2}
# Load average per usable core above which the host is too busy for trustworthy timings: the measured
# process then shares its cores with other work, and medians move by tens of percent between runs.
BUSY_LOAD_PER_CORE = 0.7


def _ratio_text(ratio: float | None) -> str:
    if ratio is None or not math.isfinite(ratio) or ratio <= 0:
        return "-"
    if abs(ratio - 1.0) < 5e-3:
        return "1.00"
    return f"{ratio:.2f} ({1 / ratio:.1f}x faster)" if ratio < 1 else f"{ratio:.2f} ({ratio:.1f}x slower)"


def _series(report: BenchReport) -> Iterator[tuple[str, str, int, list[CellResult]]]:
    """(backend key, backend name, thread budget, its cells by T) for every measured series."""
    names = {c.backend: c.backend_name for c in report.results}
    for key in sorted(names, key=lambda k: _BACKEND_ORDER.get(k, 9)):
        for threads in sorted({c.threads for c in report.results if c.backend == key}):
            cells = [c for c in report.results if c.backend == key and c.threads == threads]
            yield key, names[key], threads, sorted(cells, key=lambda c: c.frames)


def _sorted_cells(report: BenchReport) -> list[CellResult]:
    return sorted(report.results, key=lambda c: (c.frames, c.threads, _BACKEND_ORDER.get(c.backend, 9)))


def header_lines(report: BenchReport) -> list[str]:
    lines = ["vllm-omni-token2wav bench spk-embedding: CAM++ speaker embedding, onnxruntime CPU vs device backends"]
    w = report.weights
    if w is not None:
        if w.kind == "stand-in":
            lines.append(f"weights : STAND-IN campplus.onnx (stand-in, sha256 {w.sha256[:16]}...): {w.path}")
            lines.append("          random weights: embeddings are NOT a real speaker space; latency of the")
            lines.append("          full-size stand-in is representative of the shipped file (same graph)")
        else:
            lines.append(f"weights : {w.label or w.kind}: {w.path}")
            lines.append(f"          sha256 {w.sha256}")
    env = report.environment
    cfg = report.config
    if env is not None:
        budgets = ", ".join(map(str, env.threads))
        lines.append(
            f"device  : {env.device} ({env.device_name}); thread budgets {budgets} (torch intra-op threads = "
            f"onnxruntime intra-op threads per call); batch {cfg.get('batch')}"
        )
        trt = f", tensorrt {env.tensorrt_version}" if env.tensorrt_version else ""
        lines.append(
            f"versions: torch {env.torch_version}, onnxruntime {env.onnxruntime_version}{trt}; seg-pool: "
            f"onnxruntime {env.ort_seg_pool_mode}, torch {env.torch_seg_pool_mode or '-'}"
        )
        load = env.load_average_start
        end = env.load_average_end
        lines.append(
            f"load avg: {' '.join(map(str, load)) if load else '-'} at start, {' '.join(map(str, end)) if end else '-'}"
            f" at end ({env.usable_cores} usable cores, {env.cpu})"
        )
        warning = load_warning(report)
        if warning:
            lines.append(warning)
    if report.audio is not None:
        a = report.audio
        lines.append(f"audio   : {a.source} ({a.duration_s:.2f} s), tiled/cropped to T frames; {a.transform}")
    lines.append(
        f"timing  : {cfg.get('warmup')} warm-up + {cfg.get('iters')} timed calls per backend, budget and T "
        f"(fewer above T={LONG_FRAMES}), interleaved, {cfg.get('call_gap_ms', 0):.0f} ms apart"
    )
    return lines


def table_lines(report: BenchReport) -> list[str]:
    cols = (
        ("T", 5),
        ("thr", 3),
        ("backend", 16),
        ("median ms", 10),
        ("p90 ms", 8),
        ("p99 ms", 8),
        ("host ms", 8),
        ("cpu ms", 8),
        ("ratio vs ORT", 22),
        ("cosine", 10),
        ("rel L2", 7),
        ("max|diff|", 9),
        ("parity", 8),
    )
    head = "  ".join(name.rjust(width) if i != 2 else name.ljust(width) for i, (name, width) in enumerate(cols))
    lines = [head, "-" * len(head)]
    for c in _sorted_cells(report):
        parity = "ref" if c.backend == "ort" else {True: "ok", False: "MISMATCH", None: "-"}[c.parity_ok]
        values = (
            str(c.frames),
            str(c.threads),
            c.backend_name,
            fmt(c.wall.median_ms, ".2f"),
            fmt(c.wall.p90_ms, ".2f"),
            fmt(c.wall.p99_ms, ".2f"),
            fmt(c.host.median_ms, ".2f"),
            fmt(c.host_cpu.median_ms, ".2f"),
            "1.00 (reference)" if c.backend == "ort" else _ratio_text(c.ratio_vs_ort),
            fmt(c.cosine_vs_ort, ".7f"),
            fmt(c.rel_l2_diff_vs_ort, ".1e"),
            fmt(c.max_abs_diff_vs_ort, ".1e"),
            parity,
        )
        lines.append(
            "  ".join(
                v.rjust(w) if i != 2 else v.ljust(w) for i, (v, (_, w)) in enumerate(zip(values, cols, strict=True))
            )
        )
    if not report.results:
        lines.append("(no latency measured)")
    return lines


def ratio_rows(report: BenchReport) -> list[str]:
    """One line per non-reference backend and thread budget: its `ratio_vs_ort` at every T (the README's row)."""
    rows = []
    for key, name, threads, cells in _series(report):
        if key == "ort":
            continue
        parts = "  ".join(f"T={c.frames}: {fmt(c.ratio_vs_ort, '.2f')}" for c in cells)
        rows.append(
            f"ratio vs ORT, {threads} thread{'s' if threads > 1 else ''} ({name} / onnxruntime-cpu "
            f"median, below 1 = faster): {parts}"
        )
    return rows


def threads_used_lines(report: BenchReport) -> list[str]:
    """Cells whose torch calls ran with fewer threads than their budget (busy host), one line each."""
    lines = []
    for c in _sorted_cells(report):
        if c.threads_used and any(int(k) != c.threads for k in c.threads_used):
            counts = ", ".join(f"{n} calls at {k}" for k, n in c.threads_used.items())
            lines.append(
                f"T={c.frames} {c.backend_name} budget {c.threads}: other runnable threads held cores, so the "
                f"calls ran with fewer threads ({counts})"
            )
    return lines


def best_of_lines(report: BenchReport) -> list[str]:
    """Per T: each backend at its fastest thread budget, and its ratio to onnxruntime's best."""
    lines = []
    for verdict in speed_verdicts(report):
        parts = []
        for b in verdict.best:
            ratio = "" if b.backend == "ort" or b.ratio_vs_best_ort is None else f" = {b.ratio_vs_best_ort:.2f} x ORT"
            parts.append(f"{b.backend_name} {b.median_ms:.2f} ms @{b.threads}t{ratio}")
        lines.append(f"best of threads, T={verdict.frames}: " + "; ".join(parts))
    return lines


def speed_verdict_lines(report: BenchReport) -> list[str]:
    """One line per T: which backend is faster, each at its best thread budget."""
    lines = []
    for verdict in speed_verdicts(report):
        best = verdict.best
        if len(best) < 2:
            continue
        first, second = best[0], best[1]
        lines.append(
            f"verdict T={verdict.frames}: {first.backend_name} is faster ({first.median_ms:.2f} ms @{first.threads}t "
            f"vs {second.backend_name} {second.median_ms:.2f} ms @{second.threads}t, "
            f"{second.median_ms / first.median_ms:.2f}x)"
        )
    return lines


def footer_lines(report: BenchReport) -> list[str]:
    b = report.build
    lines = []
    if b.torch_cold_build_ms is not None:
        hit = fmt(b.torch_cache_hit_us, ".1f")
        lines.append(
            f"get_campplus_torch: cold build {b.torch_cold_build_ms:.1f} ms, cache hit {hit} us "
            "(a hit stats the file; it is hashed again only when its stat identity, ctime included, changed: "
            "vllm_omni_token2wav/file_identity.py)"
        )
    if b.ort_session_build_ms is not None:
        lines.append(f"onnxruntime session build: {b.ort_session_build_ms:.1f} ms")
    if b.trt_build_or_load_s is not None:
        lines.append(f"TensorRT engine build or load: {b.trt_build_or_load_s:.2f} s ({b.trt_backend_name})")
    p = report.prompt_cache
    if p is not None:
        if p.unavailable:
            lines.append(f"prompt cache: not measured ({p.unavailable})")
        elif p.hit is not None:
            lines.append(
                f"prompt cache (prepare_prompt, {fmt(p.prompt_seconds, '.2f')} s prompt, {p.backend}): "
                f"miss {fmt(p.miss_ms, '.1f')} ms, hit median {p.hit.median_ms:.3f} ms (p99 {p.hit.p99_ms:.3f} ms)"
            )
    if report.weights is not None and report.weights.standin_generated_s is not None:
        lines.append(f"stand-in generated in {report.weights.standin_generated_s:.1f} s (first use; cached now)")
    failures = report.parity_failures
    if failures:
        tol = report.tolerances
        where = ", ".join(f"{c.backend_name} T={c.frames}" for c in failures)
        lines.append(
            f"PARITY MISMATCH vs onnxruntime (needs cosine >= {tol.get('min_cosine')} and "
            f"relative L2 <= {tol.get('max_rel_l2_diff')}): {where}"
        )
    if not report.complete:
        lines.append(f"PARTIAL REPORT: the run was interrupted after {report.elapsed_s:.1f} s")
    else:
        lines.append(f"total {report.elapsed_s:.1f} s")
    return lines


def load_warning(report: BenchReport) -> str | None:
    """A header line when the host was busy (1-minute load per usable core above `BUSY_LOAD_PER_CORE`
    at the start or the end of the run), else None."""
    env = report.environment
    if env is None or env.usable_cores < 1:
        return None
    busy = [
        f"{load[0]:.2f} at {when}"
        for when, load in (("start", env.load_average_start), ("end", env.load_average_end))
        if load is not None and load[0] / env.usable_cores > BUSY_LOAD_PER_CORE
    ]
    if not busy:
        return None
    return (
        f"WARNING : busy host, load {' and '.join(busy)} on {env.usable_cores} usable cores (above "
        f"{BUSY_LOAD_PER_CORE} per core): timings are unreliable, rerun on a quiet host"
    )


def _ratio_span(cells: list[CellResult]) -> str:
    ratios = [c.ratio_vs_ort for c in cells if c.ratio_vs_ort is not None and math.isfinite(c.ratio_vs_ort)]
    if not ratios:
        return "-"
    lo, hi = min(ratios), max(ratios)
    return f"{lo:.2f}" if abs(hi - lo) < 5e-3 else f"{lo:.2f}-{hi:.2f}"


def _where(cells: list[CellResult], with_threads: bool) -> str:
    """`97,200`, or with thread budgets `97@2t,200@1t` (one entry per cell, in report order)."""
    return ",".join(f"{c.frames}@{c.threads}t" if with_threads else str(c.frames) for c in cells)


def verdict_line(report: BenchReport) -> str:
    """The report's last line: parity at every T, and which backend the serving policy picks here and why
    (the measured ratio vs onnxruntime of the backends it chose between)."""
    lengths = sorted({c.frames for c in report.results})
    compared = [c for c in report.results if c.backend != "ort"]
    if not compared:
        parity = "parity not measured (only onnxruntime ran)"
    elif report.parity_failures:
        where = ", ".join(f"{c.backend_name} T={c.frames}" for c in report.parity_failures)
        parity = f"parity FAIL at {where}"
    else:
        parity = f"parity ok at every T ({', '.join(map(str, lengths))})"
    several = len({c.threads for c in report.results}) > 1  # cells then name their thread budget
    policy = report.policy
    if policy is None:
        choice = "serving policy not determined"
    else:
        choice = f"policy on {policy.device} picks {policy.backend_name} ({policy.rule})"
        if policy.backend == "ort":
            others = {c.backend_name for c in compared}
            if others:
                spans = "; ".join(
                    f"{name} measured {_ratio_span([c for c in compared if c.backend_name == name])}x "
                    "onnxruntime's latency"
                    for name in sorted(others)
                )
                faster = [c for c in compared if c.ratio_vs_ort is not None and c.ratio_vs_ort < 1.0]
                note = f", faster than onnxruntime at T={_where(faster, several)}" if faster else ""
                choice += f": {spans} here{note}"
        else:
            mine = [c for c in compared if c.backend == policy.backend]
            if mine:
                slower = [c for c in mine if c.ratio_vs_ort is not None and c.ratio_vs_ort > 1.0]
                note = f", slower than onnxruntime at T={_where(slower, several)}" if slower else ""
                choice += f": measured {_ratio_span(mine)}x onnxruntime's latency here{note}"
    prefix = "verdict" if report.complete else "verdict (partial run)"
    return f"{prefix}: {parity}; {choice}"


def render_text(report: BenchReport) -> str:
    parts = [*header_lines(report), "", *table_lines(report), ""]
    rows = ratio_rows(report)
    if rows:
        parts += [*rows, ""]
    speed = [*threads_used_lines(report), *best_of_lines(report), *speed_verdict_lines(report)]
    if speed:
        parts += [*speed, ""]
    parts += footer_lines(report)
    parts.append(verdict_line(report))
    return "\n".join(parts) + "\n"


def report_json(report: BenchReport) -> str:
    return json_text(report.to_dict())


def write_json(report: BenchReport, path: Path) -> None:
    write_report_json(report.to_dict(), path)


def plot_png(report: BenchReport) -> bytes:
    """PNG bytes: median latency vs T per backend (bars to p90), and each backend's ratio vs onnxruntime."""
    fig = agg_figure(11, 4.5)
    lat, ratio = fig.subplots(1, 2)
    for key, name, threads, cells in _series(report):
        xs = [c.frames for c in cells]
        med = [c.wall.median_ms for c in cells]
        up = [max(c.wall.p90_ms - c.wall.median_ms, 0.0) for c in cells]
        label = f"{name} {threads}t"
        lat.errorbar(xs, med, yerr=[[0.0] * len(xs), up], marker="o", capsize=3, label=label)
        if key != "ort":
            ratio.plot(xs, [c.ratio_vs_ort for c in cells], marker="o", label=f"{label} / onnxruntime {threads}t")
    lat.set_xscale("log")
    lat.set_yscale("log")
    lat.set_xlabel("T (fbank frames, 10 ms each)")
    lat.set_ylabel("latency per call, ms (median, bar to p90)")
    lat.set_title("latency vs T")
    lat.grid(True, alpha=0.3)
    ratio.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ratio.set_xscale("log")
    ratio.set_xlabel("T (fbank frames, 10 ms each)")
    ratio.set_ylabel("median latency / onnxruntime (below 1 = faster)")
    ratio.set_title("ratio vs onnxruntime CPU, same thread budget")
    ratio.grid(True, alpha=0.3)
    for axes in (lat, ratio):
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize=8)
    env = report.environment
    where = f"{env.device} ({env.device_name}), thread budgets {env.threads}" if env is not None else ""
    standin = report.weights is not None and report.weights.kind == "stand-in"
    title = f"CAM++ speaker embedding on {where}"
    if standin:
        title += "  |  STAND-IN weights: latency only, not a real speaker space"
    if not report.complete:
        title += "  |  PARTIAL"
    return png_bytes(fig, title)


def write_plot(report: BenchReport, path: Path) -> None:
    write_bytes_atomic(path, plot_png(report))
