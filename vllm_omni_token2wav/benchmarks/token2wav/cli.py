# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav bench token2wav`: how fast is the end-to-end Token2Wav stage here, and where does the time go?

Runs `vllm_omni_token2wav.benchmarks.token2wav.run` on a token2wav directory (default: the deterministic
full-size stand-in, generated on first use and cached under the vllm_omni_token2wav cache folder; `--reduced`
for the small one tests use; `--model-dir` for a real `token2wav/`). Prints a table and writes
`out/token2wav_rtf_report.json` and `out/token2wav_rtf_report.png` (`./out/` is git-ignored) unless
`--json` / `--plot` say elsewhere.

Sizes follow the issue on an accelerator (10 s of speech tokens, 10 Euler steps, 5 runs); on a CPU
the full-size flow runs several times slower than real time, so the CPU default is 2 s and 5 steps
(3 runs), and the table and JSON say which defaults applied. Explicit options always win.

`--family cosyvoice3` runs the CosyVoice3 code2wav report instead (its options and run: `cosyvoice3/cli.py`,
`vllm_omni_token2wav.benchmarks.token2wav.cosyvoice3.run`): whole and streaming RTF, first audio, and the cost per
chunk vs chunk index against upstream's prefix re-run, on the reduced stand-in unless `--full`.

Exit codes: 0 done; 2 usage error (bad option, unusable directory or device); 130 interrupted
(the partial report is printed and its JSON written).

This module only parses options (argparse); torch and the models are imported inside `run`.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from vllm_omni_token2wav.benchmarks import bench_cli, common
from vllm_omni_token2wav.benchmarks.token2wav.cosyvoice3 import cli as token2wav_cosyvoice3
from vllm_omni_token2wav.cli_types import CLIUsageError

DEFAULT_JSON = str(bench_cli.DEFAULT_REPORT_DIR / "token2wav_rtf_report.json")
DEFAULT_PLOT = str(bench_cli.DEFAULT_REPORT_DIR / "token2wav_rtf_report.png")
MODEL_DIR_FILES = ("campplus.onnx", "speech_tokenizer_v2_25hz.onnx", "flow.yaml", "flow.pt", "hift.pt")


def resolved_device_type(device: str) -> str:
    """`cpu`, `cuda` or `npu` for the resolved `--device` (auto asks the platform, which imports torch)."""
    if device != "auto":
        return device.split(":")[0]
    from vllm_omni_token2wav import platforms

    return platforms.current_omni_platform.device_type


def _positive_seconds(option: str, value: float | None) -> None:
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise CLIUsageError(f"{option} must be a positive number of seconds, got {value}")


def _model_dir(value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise CLIUsageError(f"--model-dir {value}: no such directory")
    missing = [name for name in MODEL_DIR_FILES if not (path / name).is_file()]
    if missing:
        raise CLIUsageError(
            f"--model-dir {value}: missing {', '.join(missing)}; "
            f"a token2wav directory holds {', '.join(MODEL_DIR_FILES)}"
        )
    return path


def build_config(args: argparse.Namespace) -> Any:
    """The validated `BenchConfig` for `args` (raises `CLIUsageError` for user mistakes)."""
    if args.reduced and args.model_dir is not None:
        raise CLIUsageError("--reduced selects the small stand-in; it cannot be combined with --model-dir")
    device = bench_cli.check_device(args.device)
    _positive_seconds("--gen-seconds", args.gen_seconds)
    _positive_seconds("--prompt-seconds", args.prompt_seconds)
    for option, low in (("n_timesteps", 1), ("runs", 1), ("threads", 1), ("warmup", 0), ("prompt_calls", 1)):
        bench_cli.check_at_least("--" + option.replace("_", "-"), getattr(args, option), low)
    if args.gen_seconds is not None and round(args.gen_seconds * 25) < 1:
        raise CLIUsageError(f"--gen-seconds {args.gen_seconds}: less than one 25 Hz speech token (0.04 s)")
    bench_cli.check_output_files(args)
    model_dir = _model_dir(args.model_dir)

    from vllm_omni_token2wav.benchmarks.token2wav.run import (
        MAX_PROMPT_SECONDS,
        MIN_PROMPT_SECONDS,
        BenchConfig,
        default_plan,
    )

    if args.prompt_seconds is not None and not MIN_PROMPT_SECONDS <= args.prompt_seconds <= MAX_PROMPT_SECONDS:
        raise CLIUsageError(
            f"--prompt-seconds {args.prompt_seconds}: must be in [{MIN_PROMPT_SECONDS:g}, {MAX_PROMPT_SECONDS:g}] "
            "(the streaming caches hold at most ~16.9 s of prompt)"
        )
    device_type = resolved_device_type(device)
    plan = default_plan(device_type, fast=args.fast)
    sizes = {
        "gen_seconds": args.gen_seconds,
        "prompt_seconds": args.prompt_seconds,
        "n_timesteps": args.n_timesteps,
        "runs": args.runs,
        "warmup": args.warmup,
        "prompt_calls": args.prompt_calls,
    }
    explicit = all(value is not None for value in sizes.values())
    resolved = {name: getattr(plan, name) if value is None else value for name, value in sizes.items()}
    plan_name = (
        "explicit" if explicit else ("fast" if args.fast else ("cpu" if device_type == "cpu" else "accelerator"))
    )
    return BenchConfig(
        model_dir=model_dir,
        reduced=args.reduced,
        device=device,
        threads=common.default_threads() if args.threads is None else args.threads,
        seed=args.seed,
        plan=plan_name,
        **resolved,
    )


class Token2WavSubcommand:
    name = "token2wav"
    help = "end-to-end Token2Wav stage: RTF, first-chunk latency, component split, speaker paths"

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--family",
            choices=("step_audio2", "cosyvoice3"),
            default="step_audio2",
            help="step_audio2 (also MiniCPM-o's assets; this page's report) or cosyvoice3 (its code2wav report)",
        )
        parser.add_argument(
            "--model-dir",
            metavar="DIR",
            help="token2wav directory (campplus.onnx, speech_tokenizer_v2_25hz.onnx, flow.yaml, flow.pt, hift.pt); "
            "default: the deterministic full-size stand-in (~1.2 GB, generated on first use; random weights)",
        )
        parser.add_argument(
            "--reduced", action="store_true", help="use the reduced stand-in (small widths; for tests, not numbers)"
        )
        bench_cli.add_device_option(parser)
        parser.add_argument(
            "--gen-seconds", type=float, metavar="S", help="seconds of speech tokens to synthesise (default 10, CPU 2)"
        )
        parser.add_argument(
            "--prompt-seconds", type=float, metavar="S", help="seconds of the reference voice (default 3)"
        )
        parser.add_argument(
            "--n-timesteps", type=int, metavar="N", help="flow-matching Euler steps (default 10, CPU 5)"
        )
        parser.add_argument("--runs", type=int, metavar="N", help="timed runs per mode (default 5, CPU 3)")
        parser.add_argument("--warmup", type=int, metavar="N", help="untimed 1 s warm-up requests (default 1)")
        parser.add_argument(
            "--prompt-calls",
            type=int,
            metavar="N",
            help="timed prepare_prompt calls per speaker path (default 20, CPU 10)",
        )
        bench_cli.add_threads_option(parser)
        parser.add_argument("--seed", type=int, default=0, help="stand-in weights, speech tokens and NSF noise seed")
        bench_cli.add_report_file_options(parser, DEFAULT_JSON, DEFAULT_PLOT)
        token2wav_cosyvoice3.add_cli_args(parser)
        parser.add_argument(
            "--fast",
            action="store_true",
            help="quick look: 1.2 s generated, 1 s prompt, 2 steps, 1 run, no warm-up (explicit options win)",
        )

    def run(self, args: argparse.Namespace) -> int:
        if args.family == "cosyvoice3":
            return token2wav_cosyvoice3.run(args)
        token2wav_cosyvoice3.check_family_options(args)
        config = build_config(args)
        from vllm_omni_token2wav.benchmarks.token2wav import report as token2wav_rtf_report
        from vllm_omni_token2wav.benchmarks.token2wav.run import BenchSetupError, Token2WavBenchmark

        bench = Token2WavBenchmark(config, stage=bench_cli.stage_printer("token2wav"))
        return bench_cli.run_and_publish(
            bench,
            token2wav_rtf_report,
            BenchSetupError,
            args,
            DEFAULT_JSON,
            DEFAULT_PLOT,
            plot=lambda report: any(m.runs for m in report.modes) or bool(report.prompt_cases),
        )


SUBCOMMAND = Token2WavSubcommand()


RECORDERS = (
    bench_cli.Recorder(
        name="token2wav_rtf",
        command=("bench", "token2wav"),
        stem=bench_cli.fixed_stem("token2wav_rtf"),
        summary="token2wav_rtf_<device>: Token2Wav RTF, first audio, component split, speaker paths",
    ),
    *token2wav_cosyvoice3.RECORDERS,
)
