# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.token2wav_memory_budget`: what the stage's memory budget costs and guarantees.

Runs `benchmarks.token2wav_memory_budget.run` on the reduced stand-ins (in-process stage classes, no
server) and prints two tables: the bytes a stream holds per audio second for each family in fp32 and
reduced-precision K/V, measured after every chunk, and `--streams` concurrent CosyVoice3 replies of
`--seconds` each served under a budget that fits only `--fit` of them at once (waits, peak bytes and
RSS, every reply equal to the same request served alone). Writes `out/token2wav_memory_budget.json` and
`.txt` unless `--json` says elsewhere (the recorded `benchmarks/results/token2wav_memory_budget_cpu.*`
came from `python benchmarks/record.py token2wav_memory_budget`).

    python -m benchmarks.token2wav_memory_budget                       # 60 s replies, c=8, 3 fit
    python -m benchmarks.token2wav_memory_budget --seconds 4 --streams 3 --fit 1 --family-seconds 2

This module only parses options; torch and the models are imported inside `run`.
"""

from __future__ import annotations

import argparse
from functools import partial

from benchmarks import program, run_home
from vllm_omni_token2wav.benchmarks import bench_cli

FAMILIES = ("minicpmo_4_5", "step_audio2", "cosyvoice3")
KV_DTYPES = ("float32", "bfloat16")


class Token2wavMemoryBudgetSubcommand:
    name = "token2wav-memory-budget"
    help = "stream bytes per audio second per family (fp32, reduced K/V), and c=N long CosyVoice3 replies in a budget"

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--seconds", type=float, default=60.0, help="length of each CosyVoice3 reply")
        parser.add_argument("--streams", type=int, default=8, help="concurrent CosyVoice3 replies")
        parser.add_argument("--fit", type=int, default=3, help="replies the budget holds at once (< --streams)")
        parser.add_argument("--family-seconds", type=float, default=12.0, help="reply length of the bytes table")
        parser.add_argument("--families", default=",".join(FAMILIES), help="comma list of the bytes table's families")
        parser.add_argument("--kv-dtypes", default=",".join(KV_DTYPES), help="comma list: float32, bfloat16")
        parser.add_argument(
            "--budget-kv-dtypes", default="bfloat16", help="comma list: K/V dtypes of the c=N run (each a run)"
        )
        parser.add_argument("--n-timesteps", type=int, default=10)
        parser.add_argument("--threads", type=int, default=1)
        bench_cli.add_json_option(parser, bench_cli.DEFAULT_REPORT_DIR / "token2wav_memory_budget.json")
        bench_cli.add_unused_plot_option(parser)  # the report is its two tables

    def run(self, args: argparse.Namespace) -> int:
        from benchmarks.token2wav_memory_budget.run import execute

        return execute(args)


SUBCOMMAND = Token2wavMemoryBudgetSubcommand()

RECORDERS = (
    bench_cli.Recorder(
        program=program("token2wav_memory_budget"),
        entry=partial(run_home, "token2wav_memory_budget"),
        name="token2wav_memory_budget",
        command=(),
        stem=bench_cli.fixed_stem("token2wav_memory_budget"),
        summary="token2wav_memory_budget_<device>: bytes per audio second per family; c=8 60 s CosyVoice3 in a budget",
    ),
)
