# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.code2wav_replicas`: what a second code2wav replica buys, and that every reply stays whole.

Runs `benchmarks.code2wav_replicas.run`: the stand-in Step-Audio2 stream deployment
(`standin_step_audio2_stream.yaml`: stand-in producer -> our code2wav over vLLM-Omni's async-chunk
connector) started offline (`AsyncOmni`) once per replica count (`--replicas 1,2`: the code2wav stage's
`num_replicas`), the same closed-loop load on each (`--requests` streamed replies of `--codes` codes,
`--concurrency` in flight). Prints a table (audio s/s, wall, TTFP p50/p99, requests per replica) and
writes `out/code2wav_replicas.json` and `.txt` unless `--json` says elsewhere (the recorded
`benchmarks/results/code2wav_replicas_cpu.{json,txt}` came from `--json` there).

    python -m benchmarks.code2wav_replicas                          # 1 vs 2 replicas, 48 replies at c=8
    python -m benchmarks.code2wav_replicas --requests 8 --concurrency 2 --codes 75 --json /tmp/r.json
    python benchmarks/record.py code2wav_replicas                   # the recorded run

A reply counts as whole when it holds 960 samples per code and its replica's counters show every chunk
of it served, none on another replica (`VLLM_OMNI_TOKEN2WAV_STAGE_STATS` with `{replica}`); the audio's
equality with the stage alone is `tests/e2e/test_replicas.py`'s job. Exit code 1 when a reply was not
whole or a request failed.

This module only parses options; the engine is imported inside `run`.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from benchmarks import program, run_home
from vllm_omni_token2wav.benchmarks import bench_cli
from vllm_omni_token2wav.cli_types import CLIUsageError


def parse_counts(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values) or len(set(values)) != len(values):
        raise CLIUsageError(f"--replicas {text!r}: expected distinct replica counts >= 1 like 1,2")
    return values


class Code2WavReplicasSubcommand:
    name = "code2wav-replicas"
    help = "one vs two code2wav replicas in one deployment: audio s/s, TTFP, requests per replica, replies whole"

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--replicas", default="1,2", help="code2wav num_replicas per run (default 1,2)")
        parser.add_argument("--requests", type=int, default=48, help="streamed replies per run (default 48)")
        parser.add_argument("--concurrency", type=int, default=8, help="replies in flight (default 8)")
        parser.add_argument("--codes", type=int, default=100, help="codes per reply, 25 per audio second (100)")
        parser.add_argument("--n-timesteps", type=int, help="flow Euler steps (default: the deployment's, 10)")
        bench_cli.add_json_option(parser, bench_cli.DEFAULT_REPORT_DIR / "code2wav_replicas.json")
        # `benchmarks/record.py` passes a plot file to every command; this one draws none
        parser.add_argument("--plot", type=Path, help=argparse.SUPPRESS)

    def run(self, args: argparse.Namespace) -> int:
        replicas = parse_counts(args.replicas)
        for option in ("requests", "concurrency", "codes", "n_timesteps"):
            bench_cli.check_at_least("--" + option.replace("_", "-"), getattr(args, option), 1)
        from benchmarks.code2wav_replicas.run import execute

        return execute(args, replicas)


SUBCOMMAND = Code2WavReplicasSubcommand()

RECORDERS = (
    bench_cli.Recorder(
        program=program("code2wav_replicas"),
        entry=partial(run_home, "code2wav_replicas"),
        name="code2wav_replicas",
        command=(),
        stem=bench_cli.fixed_stem("code2wav_replicas"),
        summary="code2wav_replicas_<device>: one vs two code2wav replicas in one deployment, replies whole",
    ),
)
