# SPDX-License-Identifier: Apache-2.0
"""Developer measurements of the repository checkout: one home per benchmark, run as `python -m benchmarks.<name>`.

Why apart from the package: the installed `vllm_omni_token2wav` keeps only what an operator runs
(`vllm-omni-token2wav bench spk-embedding | token2wav | token2wav-serve | engine-ab | seed-tts |
device-check`); the measurements behind design notes (one model part, one path, a memory or cost
curve) live here beside `record.py` and `results/`, as vLLM keeps its kernel benchmarks at the
repository root. A home has the same shape as a shipped one (`run.py`, `report.py`, `cli.py` with a
`SUBCOMMAND` and, where recorded, `RECORDERS`) and reuses the package's CLI skeleton
(`vllm_omni_token2wav/benchmarks/bench_cli.py`), so options, exit codes and report files behave the same.

Run one from the repository root (the package installed, e.g. `pip install -e ".[bench]"`):

    python -m benchmarks.flow_rtf --config reduced --device cpu
    python benchmarks/record.py causal_hift_stream          # a recorded one, files under benchmarks/results/

Tests: `tests/benchmarks/<name>/` (pytest puts the repository root on `sys.path`: `tests/` is a package).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_omni_token2wav.benchmarks.bench_cli import Recorder

#: The developer homes, in the order `record.py --list` shows their recorders.
DEV_BENCHMARKS: tuple[str, ...] = (
    "cosyvoice3_flow_stream",
    "cosyvoice3_batched_flow",
    "causal_hift_stream",
    "upstream_audio",
    "token2wav_row_cost",
    "token2wav_stream_memory",
    "token2wav_memory_budget",
    "flow_rtf",
    "prompt_path",
    "audio_frontend",
    "code2wav_replicas",
    "token2wav_precision",
)


def program(name: str) -> str:
    """How a user starts the home `name`: `python -m benchmarks.<name>`."""
    return f"python -m benchmarks.{name}"


def run_home(name: str, argv: Sequence[str] | None = None) -> int:
    """Run the home `name` with `argv` (default: this process's arguments); the CLI's exit codes (2: usage)."""
    if name not in DEV_BENCHMARKS:
        raise ValueError(f"benchmarks.{name}: not a developer benchmark; one of {', '.join(DEV_BENCHMARKS)}")
    from vllm_omni_token2wav.entrypoints.cli import main as cli_main

    subcommand = importlib.import_module(f"benchmarks.{name}.cli").SUBCOMMAND
    args = sys.argv[1:] if argv is None else list(argv)
    return cli_main.run_standalone(subcommand, args, program(name))


def load_dev_recorders() -> dict[str, Recorder]:
    """The recorders the developer homes declare, by name (`benchmarks/record.py NAME`)."""
    recorders: dict[str, Recorder] = {}
    for name in DEV_BENCHMARKS:
        for recorder in getattr(importlib.import_module(f"benchmarks.{name}.cli"), "RECORDERS", ()):
            recorders[recorder.name] = recorder
    return recorders


def all_recorders() -> dict[str, Recorder]:
    """Every recorder of the checkout: the package's (`bench ...`) and the developer homes'."""
    from vllm_omni_token2wav.entrypoints.cli.bench import load_recorders

    recorders = load_recorders()
    for name, recorder in load_dev_recorders().items():
        if name in recorders:
            raise ValueError(f"benchmarks/{name}: recorder {name!r} is also declared by the package")
        recorders[name] = recorder
    return recorders
