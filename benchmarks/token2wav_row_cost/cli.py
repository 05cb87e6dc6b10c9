# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.token2wav_row_cost`: where a Token2Wav row's milliseconds go, batched vs alone.

Runs `benchmarks.token2wav_row_cost.run` (the stage's real `forward` on steady-state chunks,
R rows in one forward vs. the same R chunks one per forward, for each R of `--rows`): milliseconds
per row by part (engine, conformer encoder, CFM estimator, HiFT source, HiFT decode), the
per-launch / per-row split of the batched launches and the batching ratio it bounds, and a profile
by op category. Writes `./out/token2wav_row_cost.{json,png}` unless `--json` / `--plot` say
elsewhere. Defaults: the reduced stand-in, 1 torch thread (compare `--threads 2` on a quiet host).

This module only parses options; torch and the models are imported inside `run`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from functools import partial
from typing import Any

from benchmarks import program, run_home
from vllm_omni_token2wav.benchmarks import bench_cli
from vllm_omni_token2wav.benchmarks.token2wav_serve.cli import add_clock_option
from vllm_omni_token2wav.cli_types import CLIUsageError

DEFAULT_JSON = str(bench_cli.DEFAULT_REPORT_DIR / "token2wav_row_cost.json")
DEFAULT_PLOT = str(bench_cli.DEFAULT_REPORT_DIR / "token2wav_row_cost.png")


def parse_rows(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise CLIUsageError(f"--rows {text!r}: expected comma-separated ints like 1,2,4,8") from None
    if not values or any(v < 1 for v in values) or len(set(values)) != len(values):
        raise CLIUsageError(f"--rows {text!r}: expected distinct row counts >= 1 like 1,2,4,8")
    return values


def build_config(args: argparse.Namespace) -> Any:
    device = bench_cli.check_device(args.device)
    bench_cli.check_output_files(args)
    for option, low in (("reps", 1), ("profile_rows", 0), ("n_timesteps", 1), ("voices", 0), ("threads", 1)):
        bench_cli.check_at_least("--" + option.replace("_", "-"), getattr(args, option), low)
    if args.reference_seconds is not None and not args.reference_seconds > 0:
        raise CLIUsageError(f"--reference-seconds must be > 0, got {args.reference_seconds}")
    from benchmarks.token2wav_row_cost.run import SMOKE, RowCostConfig

    sizes: dict[str, Any] = dict(SMOKE) if args.smoke else {}
    explicit = {
        "rows": parse_rows(args.rows) if args.rows else None,
        "reps": args.reps,
        "profile_rows": args.profile_rows,
        "n_timesteps": args.n_timesteps,
        "reference_seconds": args.reference_seconds,
        "voices": args.voices,
    }
    sizes.update({k: v for k, v in explicit.items() if v is not None})
    config = RowCostConfig(
        full=args.full, device=device, threads=args.threads or 1, seed=args.seed, clock=args.clock, **sizes
    )
    try:
        config.validate()
    except ValueError as exc:
        raise CLIUsageError(str(exc)) from None
    return config


class Token2WavRowCostSubcommand:
    name = "token2wav-row-cost"
    help = "Token2Wav stage: ms per row by part, batched vs one request per forward, and the batching bound"

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--full", action="store_true", help="use the full-size stand-in (~1.2 GB, slow on CPU)")
        bench_cli.add_device_option(parser)
        parser.add_argument("--rows", metavar="R,R", help="rows per batched forward to measure (default 1,2,4,8,16)")
        parser.add_argument("--reps", type=int, metavar="N", help="interleaved repetitions, the minimum kept (5)")
        parser.add_argument("--profile-rows", type=int, metavar="R", help="rows of the profiler pass (8; 0: none)")
        parser.add_argument("--n-timesteps", type=int, metavar="N", help="flow-matching Euler steps (default 10)")
        parser.add_argument("--reference-seconds", type=float, metavar="S", help="prompt length (default 6)")
        parser.add_argument("--voices", type=int, metavar="N", help="reference voices besides the default (3)")
        parser.add_argument("--threads", type=int, metavar="N", help="torch intra-op threads (default 1)")
        parser.add_argument("--seed", type=int, default=0, help="stand-in weights and codes seed")
        add_clock_option(parser)
        parser.add_argument("--smoke", action="store_true", help="a seconds-long run (tests); explicit options win")
        bench_cli.add_report_file_options(parser, DEFAULT_JSON, DEFAULT_PLOT)

    def run(self, args: argparse.Namespace) -> int:
        config = build_config(args)
        from benchmarks.token2wav_row_cost import report as token2wav_row_cost_report
        from benchmarks.token2wav_row_cost.run import RowCostSetupError, Token2WavRowCost

        bench = Token2WavRowCost(config, stage=bench_cli.stage_printer("token2wav-row-cost"))
        return bench_cli.run_and_publish(
            bench,
            token2wav_row_cost_report,
            RowCostSetupError,
            args,
            DEFAULT_JSON,
            DEFAULT_PLOT,
            plot=lambda report: bool(report.per_row_ms),
        )


SUBCOMMAND = Token2WavRowCostSubcommand()


def stem_for(argv: Sequence[str]) -> str:
    """`token2wav_row_cost[_full][_<N>threads][_cpuclock]`: one record per size, thread count and clock."""
    stem = "token2wav_row_cost_full" if "--full" in argv else "token2wav_row_cost"
    return stem + bench_cli.thread_clock_suffix(argv)


RECORDERS = (
    bench_cli.Recorder(
        program=program("token2wav_row_cost"),
        entry=partial(run_home, "token2wav_row_cost"),
        name="token2wav_row_cost",
        command=(),
        stem=stem_for,
        summary="token2wav_row_cost[_full][_<N>threads][_cpuclock]_<device>: cost per row by part",
    ),
)
