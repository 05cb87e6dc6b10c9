# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.token2wav_stream_memory`: how many bytes does one active Token2Wav stream hold?

Runs `benchmarks.token2wav_stream_memory.run` on the stand-in of the shipped geometry
(`--reduced` for a quick check) and prints a table; writes `out/token2wav_stream_memory.json` and `.txt`
unless `--json` says elsewhere (the recorded `benchmarks/results/token2wav_stream_memory.{json,txt}`
came from `--json` there).

    python -m benchmarks.token2wav_stream_memory                   # full size, 10 s prompt
    python -m benchmarks.token2wav_stream_memory --reduced --chunks 3 --json /tmp/m.json

This module only parses options; torch and the models are imported inside `run`.
"""

from __future__ import annotations

import argparse

from vllm_omni_token2wav.benchmarks import bench_cli


class Token2wavStreamMemorySubcommand:
    name = "token2wav-stream-memory"
    help = "bytes one Token2Wav stream holds vs the floor, fp32 and bf16 caches, and what bf16 does to the audio"

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--reduced", action="store_true", help="the reduced stand-in (quick check)")
        parser.add_argument("--prompt-seconds", type=float, default=10.0)
        parser.add_argument("--chunks", type=int, default=4, help="25 + 3 token chunks (3 reach the trimmed state)")
        parser.add_argument("--n-timesteps", type=int, default=10)
        parser.add_argument("--threads", type=int, default=1)
        bench_cli.add_json_option(
            parser, bench_cli.DEFAULT_REPORT_DIR / "token2wav_stream_memory.json", deprecated=("--output",)
        )

    def run(self, args: argparse.Namespace) -> int:
        from benchmarks.token2wav_stream_memory.run import execute

        return execute(args)


SUBCOMMAND = Token2wavStreamMemorySubcommand()
