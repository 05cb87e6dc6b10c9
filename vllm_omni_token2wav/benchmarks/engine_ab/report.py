# SPDX-License-Identifier: Apache-2.0
"""Render `bench engine-ab`: the markdown table, the JSON, the PNG, and one verdict line per family.

The verdict compares the two arms only where both were measured at a level: ours / upstream audio seconds
per wall second (> 1: ours serves more), TTFP p50 at the largest common level (< 1: ours answers sooner),
peak RSS of the engine process tree (< 1: ours holds less) and failed requests. An arm that did not start or
answered no request makes the line say so, with its reason, instead of a ratio.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_omni_token2wav.atomic_io import write_bytes_atomic
from vllm_omni_token2wav.benchmarks.common import agg_figure, fmt, png_bytes
from vllm_omni_token2wav.benchmarks.common import write_json as write_report_json
from vllm_omni_token2wav.benchmarks.engine_ab.run import ARMS, PRODUCER_SEQS, ArmResult, EngineABReport, FamilyAB

MIB = 1 << 20


def _p(level: dict[str, Any], key: str, sub: str) -> float | None:
    value = level.get(key)
    return value.get(sub) if isinstance(value, dict) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _failed(arm: ArmResult) -> int:
    return sum(level.to_dict()["failed"] for level in arm.levels.values())


def comparison(fam: FamilyAB) -> dict[str, Any]:
    """ours / upstream per level both arms measured (throughput, TTFP p50/p99), peak RSS, failures."""
    up, ours = fam.arms.get("upstream"), fam.arms.get("ours")
    out: dict[str, Any] = {"levels": {}, "peak_rss_ours_over_upstream": None, "failed": {}}
    if up is None or ours is None:
        return out
    for c in sorted(set(up.levels) & set(ours.levels)):
        a, b = ours.levels[c].to_dict(), up.levels[c].to_dict()
        out["levels"][str(c)] = {
            "throughput_ours_over_upstream": _ratio(a["throughput_audio_s_per_s"], b["throughput_audio_s_per_s"]),
            "ttfp_p50_ours_over_upstream": _ratio(_p(a, "ttfp_s", "p50"), _p(b, "ttfp_s", "p50")),
            "ttfp_p99_ours_over_upstream": _ratio(_p(a, "ttfp_s", "p99"), _p(b, "ttfp_s", "p99")),
        }
    if up.measured and ours.measured:
        out["peak_rss_ours_over_upstream"] = _ratio(ours.peak_rss_bytes, up.peak_rss_bytes)
    out["failed"] = {arm.arm: _failed(arm) for arm in (up, ours)}
    return out


def _why(arm: ArmResult) -> str:
    return f"{arm.status}: {arm.first_error or arm.reason or 'no reason recorded'}"


def _served(arm: ArmResult) -> str:
    if not arm.levels:
        return "no level measured"
    c = max(arm.levels)
    level = arm.levels[c].to_dict()
    return (
        f"{fmt(level['throughput_audio_s_per_s'], '.2f')} audio s/s at c={c}, "
        f"{_failed(arm)} failed of {sum(len(x.run.requests) for x in arm.levels.values())}"
    )


def verdict(fam: FamilyAB) -> str:
    """One line: ours vs upstream on throughput, TTFP, RSS and failures (or why they cannot be compared)."""
    up, ours = fam.arms.get("upstream"), fam.arms.get("ours")
    if up is None or ours is None:
        return f"{fam.family}: not run"
    if not up.measured and not ours.measured:
        return f"{fam.family}: neither arm measured (upstream {_why(up)}; ours {_why(ours)})"
    if not up.measured:
        return f"{fam.family}: no comparison, upstream {_why(up)}; ours {_served(ours)}"
    if not ours.measured:
        return f"{fam.family}: no comparison, ours {_why(ours)}; upstream {_served(up)}"
    cmp = comparison(fam)
    levels = cmp["levels"]
    if not levels:
        return f"{fam.family}: both arms up, no level measured on both"
    thr = [(int(c), v["throughput_ours_over_upstream"]) for c, v in levels.items()]
    thr_text = ", ".join(f"x{fmt(r, '.2f')} (c={c})" for c, r in thr)
    top = str(max(int(c) for c in levels))
    ahead = [r for _, r in thr if r is not None]
    overall = (
        "ours ahead on throughput at every level"
        if ahead and all(r >= 1 for r in ahead)
        else "upstream ahead on throughput at every level"
        if ahead and all(r < 1 for r in ahead)
        else "mixed throughput"
    )
    failed = cmp["failed"]
    return (
        f"{fam.family}: audio s/s ours/upstream {thr_text}; TTFP p50 at c={top} "
        f"x{fmt(levels[top]['ttfp_p50_ours_over_upstream'], '.2f')}; peak RSS "
        f"x{fmt(cmp['peak_rss_ours_over_upstream'], '.2f')}; failed requests ours {failed.get('ours')} / "
        f"upstream {failed.get('upstream')}: {overall}"
    )


# ---------------------------------------------------------------------------------------------
# Table
# ---------------------------------------------------------------------------------------------

_HEAD = (
    "| arm | max_num_seqs | c | requests | failed | audio s/s | TTFP p50 s | TTFP p99 s | RTF p50 | underruns "
    "| peak RSS MiB |"
)


def _mib(value: int | None) -> str:
    return "-" if not value else f"{value / MIB:.0f}"


def _arm_rows(arm: ArmResult) -> list[str]:
    if not arm.levels:
        return [f"| {arm.arm} | {arm.max_num_seqs} | - | - | - | - | - | - | - | - | {_mib(arm.peak_rss_bytes)} |"]
    rows = []
    for c, level in sorted(arm.levels.items()):
        d = level.to_dict()
        rows.append(
            f"| {arm.arm} | {arm.max_num_seqs} | {c} | {d['requests']} | {d['failed']} | "
            f"{fmt(d['throughput_audio_s_per_s'], '.2f')} | {fmt(_p(d, 'ttfp_s', 'p50'), '.2f')} | "
            f"{fmt(_p(d, 'ttfp_s', 'p99'), '.2f')} | {fmt(_p(d, 'rtf', 'p50'), '.3f')} | {d['underruns']} | "
            f"{_mib(d['peak_rss_bytes'])} |"
        )
    return rows


def _fault_row(arm: ArmResult) -> str:
    f = arm.fault
    if f is None:
        return f"| {arm.arm} | - | - | - | - |"
    error = (f["bad_error"] or ("got audio" if f["bad_got_audio"] else "-")).replace("|", "/")[:160]
    return (
        f"| {arm.arm} | {f['got_audio']}/{f['requests']} | {error} | {'yes' if f['survived'] else 'no'} | "
        f"{fmt(f['recover_s'], '.2f')} |"
    )


def family_lines(fam: FamilyAB) -> list[str]:
    lines = [f"## {fam.family}", ""]
    if fam.model_dir:
        lines.append(f"stand-in folder: {fam.model_dir}")
    for name in ARMS:
        arm = fam.arms.get(name)
        if arm is None:
            continue
        status = f"{arm.status}" + (f" ({arm.reason})" if arm.reason else "")
        lines.append(
            f"- {name}: {status}; max_num_seqs {arm.max_num_seqs} from {arm.max_num_seqs_source}; "
            f"{arm.to_dict()['overrides_env']}; ready after {fmt(arm.ready_after_s, '.0f')} s, "
            f"warm-up {fmt(arm.warm_up_s, '.1f')} s, peak RSS {_mib(arm.peak_rss_bytes)} MiB"
            + (f"; first error: {arm.first_error}" if arm.first_error else "")
            + (f"; log {arm.log}" if arm.log else "")
        )
    for name in ARMS:
        arm = fam.arms.get(name)
        queued = sorted(c for c in arm.levels if c > arm.max_num_seqs) if arm else []
        if arm and queued:
            lines.append(
                f"- {name} at c = {', '.join(map(str, queued))}: the stage holds {arm.max_num_seqs} request(s) at a "
                "time (max_num_seqs); the engine queues the rest, and their TTFP includes the wait"
            )
    lines += ["", _HEAD, "|" + "---|" * (_HEAD.count("|") - 1)]
    for name in ARMS:
        if name in fam.arms:
            lines += _arm_rows(fam.arms[name])
    if any(arm.fault for arm in fam.arms.values()):
        lines += [
            "",
            "fault: 8 concurrent requests, one with an out-of-range code",
            "",
            "| arm | got audio | the bad request | engine survived | recovered after s |",
            "|---|---|---|---|---|",
        ]
        lines += [_fault_row(fam.arms[name]) for name in ARMS if name in fam.arms]
    lines += ["", f"verdict: {verdict(fam)}", ""]
    return lines


def render_text(report: EngineABReport) -> str:
    cfg = report.config
    env = report.environment
    lines = ["# vLLM-Omni's code2wav classes vs ours, same engine run (vllm-omni-token2wav bench engine-ab)", ""]
    if report.command:
        lines.append(f"command: `{report.command}`")
    engine = env.get("engine") or {}
    lines.append(
        f"host: {env.get('cpu')}, {env.get('usable_cores')} usable cores; {engine.get('vllm')}, "
        f"{engine.get('vllm_omni')}; load {env.get('loadavg_start')} -> {env.get('loadavg_end')}"
    )
    per_level = ", ".join(f"c={c}: {cfg.requests_at(c)}" for c in cfg.concurrency)
    if cfg.route == "alone":
        lines.append(
            f"route alone: /v1/completions with codec ids, {cfg.tokens} tokens ({cfg.tokens / 25:g} s of audio) "
            f"each, default voice; per level and arm {per_level}; the arm that goes first alternates per level; "
            "the stage alone serves whole utterances, so TTFP is the reply latency and underruns are 0 by construction"
        )
    elif cfg.route == "pipeline":
        lines.append(
            "route pipeline: upstream's own pipeline at toy size in both arms (its deploy YAML, its thinker / talker "
            "with random weights, standin/toy/), only the code2wav class differs; text streamed from the family's "
            f"endpoint, {cfg.tokens} codes ({cfg.tokens / 25:g} s of audio) per reply, default voice; per level and "
            f"arm {per_level}; the arm that goes first alternates per level; TTFP is the first audio delivery's "
            "(the thinker's time included), throughput counts the samples each arm delivered"
        )
    else:
        lines.append(
            f"route stream: the stand-in producer ({PRODUCER_SEQS} sequences, both arms) -> upstream's async-chunk "
            f"function -> the code2wav stage; /v1/audio/speech streamed as raw PCM, {cfg.tokens} codes "
            f"({cfg.tokens / 25:g} s of audio) per reply, default voice; per level and arm {per_level}; the arm "
            "that goes first alternates per level; TTFP is the first chunk's, underruns count late chunks"
        )
    if cfg.full_size:
        lines.append("folders: the full-size stand-ins (--full-size)")
    lines.append(
        "upstream arm: its `cosyvoice2` shim sizes the streaming flow's scratch buffers from the model "
        "(benchmarks/engine_ab/dit_scratch.py; upstream hard-codes the full-size shapes)"
    )
    lines.append("")
    for fam in report.families.values():
        lines += family_lines(fam)
    lines += [f"note: {n}" for n in report.notes]
    if not report.complete:
        lines.append("(partial report: the run did not finish)")
    return "\n".join(lines) + "\n"


def write_json(report: EngineABReport, path: Path) -> None:
    document = report.to_dict()
    for name, fam in report.families.items():
        document["families"][name]["comparison"] = comparison(fam)
        document["families"][name]["verdict"] = verdict(fam)
    write_report_json(document, path)


def plottable(report: EngineABReport) -> bool:
    return any(arm.levels for fam in report.families.values() for arm in fam.arms.values())


def write_plot(report: EngineABReport, path: Path) -> None:
    """Per family: audio seconds per wall second and TTFP p50 against concurrency, one line per arm."""
    families = [fam for fam in report.families.values() if any(arm.levels for arm in fam.arms.values())]
    if not families:
        return
    fig = agg_figure(4.2 * len(families), 6.4)
    for col, fam in enumerate(families):
        top = fig.add_subplot(2, len(families), col + 1)
        bottom = fig.add_subplot(2, len(families), len(families) + col + 1)
        for name in ARMS:
            arm = fam.arms.get(name)
            if arm is None or not arm.levels:
                continue
            levels = sorted(arm.levels)
            rows = [arm.levels[c].to_dict() for c in levels]
            top.plot(levels, [r["throughput_audio_s_per_s"] or 0.0 for r in rows], marker="o", label=name)
            ttfp = [_p(r, "ttfp_s", "p50") for r in rows]
            bottom.plot(levels, [t if t is not None else float("nan") for t in ttfp], marker="o", label=name)
        for axis, label in ((top, "audio s / wall s"), (bottom, "TTFP p50 (s)")):
            axis.set_xlabel("concurrency")
            axis.set_ylabel(label)
            axis.grid(alpha=0.3)
            axis.legend(fontsize=7)
        top.set_title(fam.family, fontsize=9)
    what = {
        "alone": "code2wav alone",
        "stream": "stand-in producer -> code2wav, streamed",
        "pipeline": "upstream's toy pipeline -> code2wav, streamed",
    }.get(report.config.route, report.config.route)
    write_bytes_atomic(path, png_bytes(fig, f"{what} in the real engine: vLLM-Omni's classes vs ours"))


__all__ = ["comparison", "family_lines", "plottable", "render_text", "verdict", "write_json", "write_plot"]
