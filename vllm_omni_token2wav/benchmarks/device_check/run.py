# SPDX-License-Identifier: Apache-2.0
"""One command that measures the device path the first time an accelerator is available.

Nothing in this project has run on an accelerator yet, and accelerators are lent rarely and briefly:
one prepared command of at most 10 minutes, 15 minutes of device time in all, and only files under
`$OUT` come back. `benchmarks/device_check.py` (this module, also `vllm-omni-token2wav bench device-check`) is
that command. It installs nothing (torch, numpy, onnx, onnxruntime, pyyaml; soxr, soundfile, scipy,
matplotlib and tensorrt are used when present), generates its own stand-ins, runs pluggable sections
under a global deadline, and rewrites one JSON report atomically after every measurement, so a run
that is killed keeps what it measured.

| section            | measures                                                                          |
|--------------------|-----------------------------------------------------------------------------------|
| `machine`          | device name, torch / CUDA / cuDNN / CANN / driver versions, CPU, host cores      |
| `assets`           | CAM++ stand-in (or `--onnx`) export and load times                                |
| `campplus_parity`  | CAM++ on the device (eager, graph-replayed, TensorRT) vs onnxruntime CPU, per T   |
| `campplus_latency` | per-call p50/p99: onnxruntime CPU 1 thread, torch eager, graph replay, TensorRT   |
| `fbank`            | Kaldi fbank on the device vs CPU: agreement and latency                          |
| `stage_assets`     | the full-size token2wav stand-in (generated on first use), timed                 |
| `prompt_path`      | `prepare_prompt` end to end (resample, fbank, CAM++, 24 kHz mel) per speaker path |
| `token2wav`        | the batched stage at concurrency 1 / 32 / 8, streaming and whole, graphs on / off |
| `graphs`           | every capture helper's counters and the device memory                           |

Runner rules: a section gets `min(its budget, time left before the deadline - RESERVE_S)` and is
skipped below `MIN_SECTION_S`; sections stop cooperatively when `ctx.out_of_time()` (status
`partial`); a hard timer (SIGALRM, main thread only) raises `SectionTimeout` `GRACE_S` after the
budget (status `timeout`); an exception ends its section only (status `error`, message and traceback
tail recorded) and later sections still run; a watchdog thread writes the report and exits the process
(code 3) when a call hangs `WATCHDOG_S` past the deadline (a hung device call never returns to Python).

`--smoke` runs the same sections and code paths with tiny sizes (CI runs it on CPU, so the script never
rots). A new section is a `run(ctx)` in a section module of this package (its API: `sections.py`) and a `Section`
in `default_sections`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final

import torch

from vllm_omni_token2wav.atomic_io import write_bytes_atomic
from vllm_omni_token2wav.benchmarks.common import finite, torch_threads
from vllm_omni_token2wav.benchmarks.device_check.sections import (
    DEFAULT_DEADLINE_S,
    SMOKE_DEADLINE_S,
    CheckConfig,
    DeviceCheckReport,
    Section,
    SectionContext,
    SectionSkip,
    SectionTimeout,
)
from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.platforms.device_graphs import FROM_PLATFORM

logger = init_logger(__name__)

SCHEMA: Final = "vllm-omni/device-check/1"
RESERVE_S: Final = 5.0
MIN_SECTION_S: Final = 3.0
GRACE_S: Final = 20.0
WATCHDOG_S: Final = 45.0
JSON_NAME: Final = "device_check.json"
TEXT_NAME: Final = "device_check.txt"
PLOT_NAME: Final = "device_check.png"


def default_sections() -> list[Section]:
    """The sections in run order (imports the section modules; each imports torch-heavy code lazily)."""
    from vllm_omni_token2wav.benchmarks.device_check import campplus, cosyvoice3, machine, stage, token2wav

    # Accelerator budgets add up to 410 s of the 420 s deadline (each section also stops at the deadline).
    return [
        Section("machine", "machine facts", 15.0, 15.0, machine.run_machine, machine.render_machine),
        Section("assets", "CAM++ model file", 35.0, 60.0, campplus.run_assets, campplus.render_assets),
        Section(
            "campplus_parity",
            "CAM++ parity vs onnxruntime CPU",
            30.0,
            40.0,
            campplus.run_parity,
            campplus.render_parity,
        ),
        Section(
            "campplus_latency", "CAM++ per-call latency", 40.0, 30.0, campplus.run_latency, campplus.render_latency
        ),
        Section("fbank", "Kaldi fbank on the device vs CPU", 10.0, 15.0, campplus.run_fbank, campplus.render_fbank),
        Section(
            "stage_assets",
            "token2wav stand-in (flow, HiFT, tokenizer)",
            45.0,
            60.0,
            token2wav.run_stage_assets,
            token2wav.render_stage_assets,
        ),
        Section(
            "prompt_path", "prepare_prompt end to end", 20.0, 30.0, stage.run_prompt_path, stage.render_prompt_path
        ),
        Section(
            "token2wav",
            "Token2Wav stage: streaming + whole at 1 / 32 / 8, graphs on vs off",
            110.0,
            90.0,
            token2wav.run_token2wav,
            token2wav.render_token2wav,
        ),
        Section(
            "cosyvoice3_assets",
            "CosyVoice3 stand-in (DiT flow, causal HiFT, tokenizer)",
            30.0,
            30.0,
            cosyvoice3.run_cosyvoice3_assets,
            cosyvoice3.render_cosyvoice3_assets,
        ),
        Section(
            "cosyvoice3",
            "CosyVoice3 stage: graphs vs eager, float32 vs reduced, chunk cost, K/V bytes, c = 1 / 8 / 32",
            65.0,
            60.0,
            cosyvoice3.run_cosyvoice3,
            cosyvoice3.render_cosyvoice3,
        ),
        Section("graphs", "capture helpers and device memory", 10.0, 10.0, stage.run_graphs, stage.render_graphs),
    ]


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _hard_timer(seconds: float) -> Iterator[None]:
    """Raise `SectionTimeout` in the main thread after `seconds` (no-op elsewhere or without SIGALRM)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise SectionTimeout(f"hard timer fired after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _Watchdog:
    """Writes the report and exits the process when the main thread is stuck past the deadline."""

    def __init__(self, report: DeviceCheckReport, exit_at: float, current: Callable[[], str | None]) -> None:
        self._report = report
        self._exit_at = exit_at
        self._current = current
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="device-check-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        if self._stop.wait(max(self._exit_at - time.monotonic(), 0.0)):
            return
        section = self._current()
        self._report.document["aborted"] = (
            f"watchdog: section {section!r} did not return {WATCHDOG_S:.0f} s past the deadline"
        )
        with contextlib.suppress(Exception):
            self._report.write()
        print(f"device-check: {self._report.document['aborted']}; report written, exiting", file=sys.stderr, flush=True)
        os._exit(3)


def _new_document(config: CheckConfig, command: str, sections: Sequence[Section]) -> dict[str, Any]:
    cfg = asdict(config)
    for key in ("out_dir", "onnx", "model_dir"):
        cfg[key] = None if cfg[key] is None else str(cfg[key])
    cfg["deadline_s"] = config.resolved_deadline_s
    return {
        "schema": SCHEMA,
        "benchmark": "device_check",
        "complete": False,
        "aborted": None,
        "command": command,
        "config": cfg,
        "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "elapsed_s": 0.0,
        "goals": {},
        "sections": {
            s.name: {
                "title": s.title,
                "status": "pending",
                "budget_s": None,
                "elapsed_s": None,
                "error": None,
                "notes": [],
                "result": {},
            }
            for s in sections
        },
    }


def select_sections(names: Sequence[str], available: Sequence[Section]) -> list[Section]:
    """The sections named (in the default order), or all; ValueError naming unknown ones."""
    if not names:
        return list(available)
    known = [s.name for s in available]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [s for s in available if s.name in names]


def run_device_check(
    config: CheckConfig,
    *,
    sections: Sequence[Section] | None = None,
    command: str = "",
    graph_api: Any = FROM_PLATFORM,
    log: Callable[[str], None] | None = None,
) -> DeviceCheckReport:
    """Run the sections in order under the deadline; the report file is current after every measurement.

    `graph_api` is handed to the capture helpers the sections build (default: the platform's); the CI
    smoke test passes the fake graph runtime so the graph code paths run on CPU too.
    """
    from vllm_omni_token2wav.benchmarks.common import resolve_device

    log = log if log is not None else (lambda text: print(text, file=sys.stderr, flush=True))
    available = list(sections) if sections is not None else default_sections()
    chosen = select_sections(config.sections, available)
    device = resolve_device(config.device)
    out_dir = Path(config.out_dir)
    report = DeviceCheckReport(out_dir / JSON_NAME, _new_document(config, command, chosen))
    report.write()
    start = time.monotonic()
    deadline = start + config.resolved_deadline_s
    shared: dict[str, Any] = {}
    current: list[str | None] = [None]
    watchdog = _Watchdog(report, deadline + WATCHDOG_S, lambda: current[0])
    watchdog.start()
    log(
        f"device-check: {len(chosen)} sections on {device}, deadline {config.resolved_deadline_s:.0f} s, "
        f"report {report.path}"
    )
    try:
        with torch_threads(config.threads):
            for section in chosen:
                current[0] = section.name
                _run_section(section, config, device, report, deadline, shared, graph_api, log)
                report.document["elapsed_s"] = time.monotonic() - start
                report.write()
        report.document["complete"] = True
    finally:
        watchdog.stop()
        report.document["elapsed_s"] = time.monotonic() - start
        report.write()
    return report


def _run_section(
    section: Section,
    config: CheckConfig,
    device: torch.device,
    report: DeviceCheckReport,
    deadline: float,
    shared: dict[str, Any],
    graph_api: Any,
    log: Callable[[str], None],
) -> None:
    entry = report.section(section.name)
    left = deadline - time.monotonic() - RESERVE_S
    budget = min(section.budget(config.smoke), left)
    if budget < MIN_SECTION_S:
        entry["status"] = "skipped"
        entry["error"] = (
            f"global deadline: {max(left, 0.0):.0f} s left, the section needs at least {MIN_SECTION_S:.0f} s"
        )
        log(f"[{section.name}] skipped: {entry['error']}")
        return
    entry["status"] = "running"
    entry["budget_s"] = budget
    report.write()
    ctx = SectionContext(
        config=config,
        device=device,
        report=report,
        name=section.name,
        deadline=time.monotonic() + budget,
        shared=shared,
        graph_api=graph_api,
        log=log,
    )
    log(f"[{section.name}] {section.title} (budget {budget:.0f} s)")
    started = time.monotonic()
    try:
        with _hard_timer(budget + GRACE_S):
            section.run(ctx)
        entry["status"] = "partial" if ctx.partial else "ok"
    except SectionSkip as exc:
        entry["status"] = "skipped"
        entry["error"] = str(exc)
    except SectionTimeout as exc:
        entry["status"] = "timeout"
        entry["error"] = f"{exc}; the result holds what was measured before"
    except KeyboardInterrupt:
        entry["status"] = "error"
        entry["error"] = "interrupted (Ctrl-C)"
        raise
    except Exception as exc:  # a failing section must not stop the check: record it, run the next one
        entry["status"] = "error"
        entry["error"] = f"{type(exc).__name__}: {exc}"
        entry["traceback"] = traceback.format_exc(limit=12).splitlines()[-25:]
    finally:
        entry["elapsed_s"] = time.monotonic() - started
        report.write()
    suffix = f": {entry['error']}" if entry["error"] else ""
    log(f"[{section.name}] {entry['status']} in {entry['elapsed_s']:.1f} s{suffix}")


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------


def render_text(document: dict[str, Any], sections: Sequence[Section] | None = None) -> str:
    """The printed table: section statuses, each section's rows, then the issue's goals."""
    lines = [f"device check ({document['config']['device']}, smoke={document['config']['smoke']}):"]
    renderers = {s.name: s.render for s in (sections if sections is not None else default_sections())}
    for name, entry in document["sections"].items():
        elapsed = "-" if entry["elapsed_s"] is None else f"{entry['elapsed_s']:.1f} s"
        lines.append(f"== {name}: {entry['status']} ({elapsed}) {entry['title']}")
        if entry["error"]:
            lines.append(f"   {entry['error']}")
        render = renderers.get(name)
        if render is not None and entry["result"]:
            try:
                lines.extend(f"   {line}" for line in render(entry["result"]))
            except (KeyError, TypeError, ValueError) as exc:  # a partial result: say so, keep the rest
                lines.append(f"   (cannot render the partial result: {type(exc).__name__}: {exc})")
        for note in entry["notes"]:
            lines.append(f"   note: {note}")
    if document["goals"]:
        lines.append("== goals")
        for name, goal in document["goals"].items():
            verdict = {True: "PASS", False: "MISS", None: "n/a"}[goal["passed"]]
            value = "-" if goal["value"] is None else f"{goal['value']:.6g}"
            lines.append(f"   {verdict:4} {name}: {value} (target {goal['target']}; {goal['where']})")
    if document.get("aborted"):
        lines.append(f"ABORTED: {document['aborted']}")
    state = "complete" if document["complete"] else "INCOMPLETE"
    lines.append(f"{state} in {document['elapsed_s']:.1f} s")
    return "\n".join(lines) + "\n"


def write_plot(document: dict[str, Any], path: Path) -> bool:
    """CAM++ latency bars (p50 per backend and T, log scale) as PNG; False when there is nothing to plot
    or matplotlib is not installed."""
    rows = document["sections"].get("campplus_latency", {}).get("result", {}).get("rows", [])
    if not rows:
        return False
    try:
        from vllm_omni_token2wav.benchmarks.common import agg_figure, png_bytes
    except ImportError:
        return False
    try:
        fig = agg_figure(8.0, 4.5)
    except ImportError:
        return False
    ax = fig.add_subplot(1, 1, 1)
    frames = sorted({r["frames"] for r in rows})
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    width = 0.8 / max(len(backends), 1)
    for i, backend in enumerate(backends):
        values = [
            next((r["p50_ms"] for r in rows if r["frames"] == t and r["backend"] == backend), None) for t in frames
        ]
        xs = [j + i * width for j, v in enumerate(values) if v]
        ax.bar(xs, [v for v in values if v], width=width, label=backend)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(frames))], [str(t) for t in frames])
    ax.set_yscale("log")
    ax.set_xlabel("frames T")
    ax.set_ylabel("p50 ms per call (log)")
    ax.legend(fontsize=8)
    name = document["sections"].get("machine", {}).get("result", {}).get("device", {}).get("name", "")
    write_bytes_atomic(path, png_bytes(fig, f"CAM++ per-call latency {name}".strip()))
    return True


def finish(report: DeviceCheckReport, sections: Sequence[Section] | None = None) -> str:
    """Write the table (.txt) and the plot (.png) next to the JSON; returns the table."""
    text = render_text(report.document, sections)
    write_bytes_atomic(report.path.with_name(TEXT_NAME), text.encode())
    with contextlib.suppress(Exception):  # the plot is a convenience; the JSON and table are the record
        write_plot(report.document, report.path.with_name(PLOT_NAME))
    return text


def load_document(path: Path) -> dict[str, Any]:
    return finite(json.loads(Path(path).read_text()))  # type: ignore[no-any-return]


__all__ = [
    "DEFAULT_DEADLINE_S",
    "JSON_NAME",
    "PLOT_NAME",
    "SCHEMA",
    "SMOKE_DEADLINE_S",
    "TEXT_NAME",
    "CheckConfig",
    "DeviceCheckReport",
    "Section",
    "SectionContext",
    "SectionSkip",
    "SectionTimeout",
    "default_sections",
    "finish",
    "load_document",
    "render_text",
    "run_device_check",
    "select_sections",
]
