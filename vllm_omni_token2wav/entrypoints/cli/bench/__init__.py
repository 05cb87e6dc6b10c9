# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav bench ...`: the benchmark subcommands.

Each entry of `BENCH_SUBCOMMANDS` names a module exposing `SUBCOMMAND` (a `CLISubcommand`).
Modules are imported when the parser is built, so they must keep heavy imports inside `run`.
"""

from __future__ import annotations

import importlib

from vllm_omni_token2wav.entrypoints.cli.types import CLISubcommand

# Order is the order shown in `vllm-omni-token2wav bench --help`.
BENCH_SUBCOMMANDS: tuple[str, ...] = (
    "vllm_omni_token2wav.entrypoints.cli.bench.spk_embedding",
    "vllm_omni_token2wav.entrypoints.cli.bench.seed_tts",
    "vllm_omni_token2wav.entrypoints.cli.bench.token2wav",
    "vllm_omni_token2wav.entrypoints.cli.bench.cosyvoice3_flow",
    "vllm_omni_token2wav.entrypoints.cli.bench.device_check",
    "vllm_omni_token2wav.entrypoints.cli.bench.causal_hift",
    "vllm_omni_token2wav.entrypoints.cli.bench.token2wav_serve",
    "vllm_omni_token2wav.entrypoints.cli.bench.token2wav_row_cost",
)


def load_bench_subcommands() -> list[CLISubcommand]:
    return [importlib.import_module(path).SUBCOMMAND for path in BENCH_SUBCOMMANDS]
