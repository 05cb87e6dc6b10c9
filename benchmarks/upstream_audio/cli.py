# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.upstream_audio`: does our Token2Wav give vLLM-Omni 0.30's own audio?

Runs `benchmarks.upstream_audio.run` outside the engine: upstream's Step-Audio2
`StepAudio2Token2WavCore` and ours on the upstream-compatible reduced stand-in (or `--model-dir`), the
same tokens, voice and noise, compared stage by stage (prompt features, flow mel, HiFT audio) for a
whole utterance and a stream. Prints a table and writes `out/upstream_audio.json` unless `--json` says
elsewhere. Needs the engine venv (vllm-omni 0.30, s3tokenizer, hyperpyyaml, stepaudio2-minicpmo).
How the noise is made identical and what each difference is: docs/benchmarks/upstream_audio.md.

This module only parses options; torch and the models are imported inside `run`.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from benchmarks import program, run_home
from vllm_omni_token2wav.benchmarks import bench_cli
from vllm_omni_token2wav.cli_types import CLIUsageError

DEFAULT_JSON = str(bench_cli.DEFAULT_REPORT_DIR / "upstream_audio.json")
DEFAULT_PLOT = str(bench_cli.DEFAULT_REPORT_DIR / "upstream_audio.png")


class UpstreamAudioSubcommand:
    name = "upstream-audio"
    help = "ours vs vLLM-Omni 0.30's Token2Wav classes: same tokens, voice and noise; mel and audio agreement"

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--model-dir", type=Path, default=None, help="token2wav folder (default: stand-in)")
        parser.add_argument("--tokens", type=int, default=100, help="speech tokens (25 Hz; default 100 = 4 s)")
        parser.add_argument("--n-timesteps", type=int, default=10, help="flow Euler steps, 1..16 (default 10)")
        parser.add_argument("--seed", type=int, default=0, help="flow-noise and NSF-noise seed")
        parser.add_argument("--no-stream", action="store_true", help="whole utterance only")
        bench_cli.add_threads_option(parser)
        bench_cli.add_report_file_options(parser, DEFAULT_JSON, DEFAULT_PLOT)

    def run(self, args: argparse.Namespace) -> int:
        bench_cli.check_at_least("--tokens", args.tokens, 2)
        bench_cli.check_at_least("--n-timesteps", args.n_timesteps, 1)
        bench_cli.check_at_least("--threads", args.threads, 1)
        bench_cli.check_output_files(args, ("json",))
        if args.model_dir is not None and not args.model_dir.is_dir():
            raise CLIUsageError(f"--model-dir {args.model_dir}: no such directory")
        from benchmarks.upstream_audio import report as upstream_audio_report
        from benchmarks.upstream_audio.run import (
            BenchSetupError,
            UpstreamAudioComparison,
            UpstreamAudioConfig,
        )
        from vllm_omni_token2wav.benchmarks import common

        config = UpstreamAudioConfig(
            model_dir=args.model_dir,
            tokens=args.tokens,
            n_timesteps=args.n_timesteps,
            seed=args.seed,
            threads=common.default_threads() if args.threads is None else args.threads,
            streaming=not args.no_stream,
        )
        try:
            bench = UpstreamAudioComparison(config, stage=bench_cli.stage_printer("upstream-audio"))
        except BenchSetupError as exc:
            raise CLIUsageError(str(exc)) from None
        return bench_cli.run_and_publish(
            bench,
            upstream_audio_report,
            BenchSetupError,
            args,
            DEFAULT_JSON,
            DEFAULT_PLOT,
            plot=lambda report: False,
        )


SUBCOMMAND = UpstreamAudioSubcommand()

RECORDERS = (
    bench_cli.Recorder(
        program=program("upstream_audio"),
        entry=partial(run_home, "upstream_audio"),
        name="upstream_audio",
        command=(),
        stem=bench_cli.fixed_stem("upstream_audio"),
        summary="upstream_audio_<device>: ours vs vLLM-Omni 0.30's Token2Wav classes, mel and audio agreement",
    ),
)
