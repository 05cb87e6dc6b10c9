# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav bench ...`: the registry of benchmark homes, and nothing else.

Only the benchmarks an operator runs are here (the developer measurements are the repository's
`benchmarks/<name>/`, `python -m benchmarks.<name>`, not installed; `benchmarks/record.py` adds their
recorders). Each lives in its own home, `vllm_omni_token2wav/benchmarks/<name>/` (name = subcommand),
whose `cli.py` exposes `SUBCOMMAND` (a `CLISubcommand`: `bench <name>`) and, for a benchmark whose runs are kept under
`benchmarks/results/`, `RECORDERS` (the `bench_cli.Recorder`s `benchmarks/record.py` knows by name).
The modules are imported when the parser is built, so they must keep heavy imports inside `run`.
Running a recorder is `entrypoints/cli/record.py`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from vllm_omni_token2wav.benchmarks.bench_cli import Recorder
from vllm_omni_token2wav.cli_types import CLISubcommand

# Order is the order shown in `vllm-omni-token2wav bench --help` (and `benchmarks/record.py --list`).
BENCH_CLIS: tuple[str, ...] = (
    "vllm_omni_token2wav.benchmarks.spk_embedding.cli",
    "vllm_omni_token2wav.benchmarks.seed_tts.cli",
    "vllm_omni_token2wav.benchmarks.token2wav.cli",
    "vllm_omni_token2wav.benchmarks.device_check.cli",
    "vllm_omni_token2wav.benchmarks.token2wav_serve.cli",
    "vllm_omni_token2wav.benchmarks.engine_ab.cli",
)


def _modules() -> list[ModuleType]:
    return [importlib.import_module(path) for path in BENCH_CLIS]


def load_bench_subcommands() -> list[CLISubcommand]:
    return [module.SUBCOMMAND for module in _modules()]


def load_recorders() -> dict[str, Recorder]:
    """Every home's recorders by name (`bench token2wav`'s home also lists the `--family cosyvoice3` one)."""
    recorders: dict[str, Recorder] = {}
    for module in _modules():
        for recorder in getattr(module, "RECORDERS", ()):
            if recorder.name in recorders:
                raise ValueError(f"{module.__name__}: recorder {recorder.name!r} is declared twice")
            recorders[recorder.name] = recorder
    return recorders
