# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.cosyvoice3_flow_stream`: does a CosyVoice3 flow chunk cost the same at 50 as at 1?

Runs `benchmarks.cosyvoice3_flow_stream.run`: the cached stream and upstream's prefix re-run,
interleaved chunk by chunk in one process, then the stream's last call with full attention (the default)
and block-causal side by side, on the reduced stand-in flow by default (`--full` for the
full-size stand-in, `--model-dir` for a Fun-CosyVoice3 directory with `flow.pt` + `cosyvoice3.yaml`).
Prints a table and writes `out/cosyvoice3_flow_stream.json` and `.png` (git-ignored) unless
`--json` / `--plot` say elsewhere.

Exit codes: 0 done; 2 usage error; 130 interrupted (the partial report is printed and written).
This module only parses options; torch and the models are imported inside `run`.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from benchmarks import program, run_home
from vllm_omni_token2wav.benchmarks import bench_cli, common
from vllm_omni_token2wav.benchmarks.token2wav.cosyvoice3.cli import parse_indices
from vllm_omni_token2wav.cli_types import CLIUsageError

DEFAULT_JSON = str(bench_cli.DEFAULT_REPORT_DIR / "cosyvoice3_flow_stream.json")
DEFAULT_PLOT = str(bench_cli.DEFAULT_REPORT_DIR / "cosyvoice3_flow_stream.png")


def build_config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The validated `BenchConfig` for `args` (raises `CLIUsageError` for user mistakes)."""
    if args.full and args.model_dir is not None:
        raise CLIUsageError("--full selects the full-size stand-in; it cannot be combined with --model-dir")
    device = bench_cli.check_device(args.device)
    bench_cli.check_output_files(args)
    model_dir = None
    if args.model_dir is not None:
        model_dir = Path(args.model_dir).expanduser()
        if not (model_dir / "flow.pt").is_file():
            raise CLIUsageError(f"--model-dir {args.model_dir}: no flow.pt inside (a Fun-CosyVoice3 directory)")
    from benchmarks.cosyvoice3_flow_stream.run import BenchConfig, BenchSetupError

    config = BenchConfig(
        model_dir=model_dir,
        full=args.full,
        device=device,
        threads=common.default_threads() if args.threads is None else args.threads,
        prompt_tokens=args.prompt_tokens,
        hop_tokens=args.hop_tokens,
        chunks=args.chunks,
        n_timesteps=args.n_timesteps,
        repeats=args.repeats,
        baseline_at=tuple(k for k in parse_indices(args.baseline_at) if k <= args.chunks) or (1,),
        seed=args.seed,
        final_tokens=args.final_tokens,
    )
    try:
        config.validate()
    except BenchSetupError as exc:
        raise CLIUsageError(str(exc)) from None
    bench_cli.check_at_least("--threads", config.threads, 1)
    return config


class CosyVoice3FlowSubcommand:
    name = "cosyvoice3-flow"
    help = "CosyVoice3 flow streaming: cost per chunk vs chunk index, cached stream vs upstream prefix re-run"

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--model-dir", metavar="DIR", help="Fun-CosyVoice3 directory (flow.pt, cosyvoice3.yaml)")
        parser.add_argument(
            "--full", action="store_true", help="full-size stand-in (1.3 GB, generated on first use) instead of reduced"
        )
        bench_cli.add_device_option(parser)
        parser.add_argument(
            "--prompt-tokens", type=int, default=75, metavar="N", help="prompt tokens (default 75 = 3 s)"
        )
        parser.add_argument(
            "--hop-tokens", type=int, default=25, metavar="N", help="tokens per chunk after the first (default 25)"
        )
        parser.add_argument("--chunks", type=int, default=50, metavar="N", help="chunks per stream (default 50)")
        parser.add_argument("--n-timesteps", type=int, default=10, metavar="N", help="Euler steps (default 10)")
        parser.add_argument("--repeats", type=int, default=3, metavar="N", help="streams measured (default 3)")
        parser.add_argument(
            "--baseline-at",
            default="1,2,5,10,20,30,40,50",
            metavar="I,J,..",
            help="chunk indices where the prefix re-run is timed (default 1,2,5,10,20,30,40,50)",
        )
        parser.add_argument(
            "--final-tokens",
            type=int,
            default=25,
            metavar="N",
            help="tokens of the stream's last call, timed with full attention (default) and block-causal (default 25)",
        )
        bench_cli.add_threads_option(parser)
        parser.add_argument("--seed", type=int, default=0, help="stand-in weights and token seed")
        bench_cli.add_report_file_options(parser, DEFAULT_JSON, DEFAULT_PLOT)

    def run(self, args: argparse.Namespace) -> int:
        config = build_config(args)
        from benchmarks.cosyvoice3_flow_stream import report as cosyvoice3_flow_stream_report
        from benchmarks.cosyvoice3_flow_stream.run import BenchSetupError, FlowStreamBenchmark

        bench = FlowStreamBenchmark(config, stage=bench_cli.stage_printer("cosyvoice3-flow"))
        return bench_cli.run_and_publish(
            bench,
            cosyvoice3_flow_stream_report,
            BenchSetupError,
            args,
            DEFAULT_JSON,
            DEFAULT_PLOT,
            plot=lambda report: any(c.ours_ms for c in report.chunks),
        )


SUBCOMMAND = CosyVoice3FlowSubcommand()


RECORDERS = (
    bench_cli.Recorder(
        program=program("cosyvoice3_flow_stream"),
        entry=partial(run_home, "cosyvoice3_flow_stream"),
        name="cosyvoice3_flow_stream",
        command=(),
        stem=bench_cli.fixed_stem("cosyvoice3_flow_stream"),
        summary="cosyvoice3_flow_stream_<device>[_<tag>] (--tag T): flow cost per chunk vs chunk index",
        tag_option=True,
    ),
)
