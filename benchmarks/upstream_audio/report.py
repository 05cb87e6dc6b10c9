# SPDX-License-Identifier: Apache-2.0
"""Rendering of `python -m benchmarks.upstream_audio`: the agreement table it prints and the JSON it writes.

Kept apart from `run.py` so the table and JSON can be tested without the engine or any model.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from benchmarks.upstream_audio.run import Agreement, UpstreamAudioReport

HEADER = ("case", "quantity", "n ours", "n upstream", "max abs", "rel L2", "note")


def _number(value: float) -> str:
    return f"{value:.2e}" if value else "0"


def row_cells(row: Agreement) -> tuple[str, ...]:
    if row.quantity.startswith("prompt tokens"):
        max_abs = f"{int(row.max_abs)} of {min(row.n_ours, row.n_upstream)}"
        rel = f"{row.rel_l2:.1%}"
    else:
        max_abs, rel = _number(row.max_abs), _number(row.rel_l2)
    length = "" if row.same_length else " (lengths differ)"
    return (row.case, row.quantity, str(row.n_ours), str(row.n_upstream), max_abs, rel, row.note + length)


def render_text(report: UpstreamAudioReport) -> str:
    cfg = report.config
    lines = [
        "Ours vs vLLM-Omni 0.30's own Token2Wav classes (outside the engine): same tokens, voice and noise",
        f"folder: {report.model_dir}",
        f"tokens: {cfg.tokens}, Euler steps: {cfg.n_timesteps}, seed: {cfg.seed}, threads: {cfg.threads}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in sorted(report.versions.items())),
        "rel L2 = ||ours - upstream|| / ||upstream|| over the common length; tokens: differing positions",
        "",
    ]
    cells = [HEADER, *(row_cells(row) for row in report.rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    for i, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    if report.seconds:
        lines += ["", "wall seconds (one call each, not a benchmark of speed):"]
        lines += [f"  {k}: {v:.3f}" for k, v in report.seconds.items()]
    if report.command:
        lines += ["", f"command: {report.command}"]
    return "\n".join(lines) + "\n"


def to_json(report: UpstreamAudioReport) -> dict[str, Any]:
    config = dataclasses.asdict(report.config)
    config["model_dir"] = str(config["model_dir"]) if config["model_dir"] is not None else None
    return {
        "benchmark": "upstream_audio",
        "config": config,
        "model_dir": report.model_dir,
        "versions": report.versions,
        "rows": [dataclasses.asdict(row) for row in report.rows],
        "seconds": report.seconds,
        "command": report.command,
    }


def write_json(report: UpstreamAudioReport, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(report), indent=2) + "\n")


def write_plot(report: UpstreamAudioReport, path: Path) -> None:
    """No plot: the comparison is a table (publish_report is called with plot=False)."""
    raise NotImplementedError("python -m benchmarks.upstream_audio writes no plot")
