# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.causal_hift_stream`: does a streamed causal-HiFT chunk cost the same at chunk 50 as at chunk 1?

Runs `benchmarks.causal_hift_stream.run`: the bounded `CausalHiFTStreamer` against upstream
CosyVoice3's cumulative re-run, chunk by chunk on one model (default: the reduced deterministic
stand-in; `--full` for the shipped geometry; `--hift` for a real hift.pt). Prints a table and
writes `causal_hift_stream_report.json` and `causal_hift_stream_report.png` to the current folder
unless `--json` / `--plot` say elsewhere.

Exit codes: 0 done; 2 usage error; 130 interrupted (the partial report is printed and written).
This module only parses options (argparse); torch and the models are imported inside `run`.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from benchmarks import program, run_home
from vllm_omni_token2wav.benchmarks import bench_cli, common
from vllm_omni_token2wav.cli_types import CLIUsageError

DEFAULT_JSON = "causal_hift_stream_report.json"
DEFAULT_PLOT = "causal_hift_stream_report.png"


class CausalHiFTSubcommand:
    name = "causal-hift"
    help = "causal HiFT streaming: time per chunk vs chunk index, bounded state vs cumulative re-run"

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        source = parser.add_mutually_exclusive_group()
        source.add_argument(
            "--hift", metavar="PATH", help="a causal hift.pt (Fun-CosyVoice3 layout) instead of the stand-in"
        )
        source.add_argument(
            "--full", action="store_true", help="full-size stand-in (20.8 M parameters) instead of the reduced one"
        )
        bench_cli.add_device_option(parser)
        parser.add_argument("--chunks", type=int, default=55, metavar="N", help="chunks per stream (default 55)")
        parser.add_argument(
            "--chunk-frames", type=int, default=50, metavar="N", help="mel frames per chunk (default 50 = 25 tokens)"
        )
        parser.add_argument(
            "--runs", type=int, default=1, metavar="N", help="timed passes; medians per chunk (default 1)"
        )
        parser.add_argument(
            "--warmup-chunks", type=int, default=3, metavar="N", help="untimed chunks of each mode first (default 3)"
        )
        bench_cli.add_threads_option(parser)
        parser.add_argument("--seed", type=int, default=0, help="stand-in weights and mel seed")
        bench_cli.add_report_file_options(parser, DEFAULT_JSON, DEFAULT_PLOT)

    def run(self, args: argparse.Namespace) -> int:
        device = bench_cli.check_device(args.device)
        for option in ("chunks", "chunk_frames", "runs"):
            bench_cli.check_at_least("--" + option.replace("_", "-"), getattr(args, option), 1)
        bench_cli.check_at_least("--warmup-chunks", args.warmup_chunks, 0)
        bench_cli.check_at_least("--threads", args.threads, 1)
        bench_cli.check_output_files(args)
        from benchmarks.causal_hift_stream import report as causal_hift_stream_report
        from benchmarks.causal_hift_stream.run import (
            BenchSetupError,
            CausalHiFTStreamBenchmark,
            StreamBenchConfig,
        )

        config = StreamBenchConfig(
            hift=Path(args.hift).expanduser() if args.hift else None,
            full=args.full,
            device=device,
            chunks=args.chunks,
            chunk_frames=args.chunk_frames,
            runs=args.runs,
            warmup_chunks=args.warmup_chunks,
            threads=common.default_threads() if args.threads is None else args.threads,
            seed=args.seed,
        )
        try:
            bench = CausalHiFTStreamBenchmark(config, stage=bench_cli.stage_printer("causal-hift"))
        except BenchSetupError as exc:
            raise CLIUsageError(str(exc)) from None
        return bench_cli.run_and_publish(
            bench,
            causal_hift_stream_report,
            BenchSetupError,
            args,
            DEFAULT_JSON,
            DEFAULT_PLOT,
            plot=lambda report: bool(report.median_chunk_ms("bounded")),
        )


SUBCOMMAND = CausalHiFTSubcommand()


RECORDERS = (
    bench_cli.Recorder(
        program=program("causal_hift_stream"),
        entry=partial(run_home, "causal_hift_stream"),
        name="causal_hift_stream",
        command=(),
        stem=bench_cli.full_stem("causal_hift_stream"),
        summary="causal_hift_stream[_full]_<device>: cost per chunk, bounded vs cumulative re-run",
    ),
)
