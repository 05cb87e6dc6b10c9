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
    "vllm_omni_token2wav.benchmarks.spk_embedding.cli",
    "vllm_omni_token2wav.benchmarks.seed_tts.cli",
    "vllm_omni_token2wav.benchmarks.token2wav_rtf.cli",
    "vllm_omni_token2wav.benchmarks.cosyvoice3_flow_stream.cli",
    "vllm_omni_token2wav.benchmarks.device_check.cli",
    "vllm_omni_token2wav.benchmarks.causal_hift_stream.cli",
    "vllm_omni_token2wav.benchmarks.token2wav_serve.cli",
    "vllm_omni_token2wav.benchmarks.token2wav_row_cost.cli",
)


def load_bench_subcommands() -> list[CLISubcommand]:
    return [importlib.import_module(path).SUBCOMMAND for path in BENCH_SUBCOMMANDS]
