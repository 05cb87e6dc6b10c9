# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav bench token2wav --family cosyvoice3`: the CosyVoice3 code2wav report's options and run.

`bench token2wav` serves both reports; this module holds what only the CosyVoice3 one takes
(`--full`, `--chunks`, `--hop-tokens`, `--baseline-at`) and turns the options into its `BenchConfig`:
the reduced stand-in by default (`--full`: the shipped geometry, random weights; `--model-dir`: a
Fun-CosyVoice3 directory with `default_voice.wav` + `default_voice.tokens`). Defaults follow the
issue (10 s, 10 steps, 50 chunks of 25 tokens); the full size on a CPU defaults to 1 Euler step and
20 chunks (a run of under an hour on 2 cores); explicit options always win. Reports go to
`out/token2wav_cosyvoice3.{json,png}` unless `--json` / `--plot` say elsewhere.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vllm_omni_token2wav.benchmarks import bench_cli, common
from vllm_omni_token2wav.cli_types import CLIUsageError

DEFAULT_JSON = str(bench_cli.DEFAULT_REPORT_DIR / "token2wav_cosyvoice3.json")
DEFAULT_PLOT = str(bench_cli.DEFAULT_REPORT_DIR / "token2wav_cosyvoice3.png")


def parse_indices(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise CLIUsageError(f"--baseline-at {text!r}: expected comma-separated chunk indices such as 1,20,50") from None
    return values


MODEL_DIR_FILES = ("campplus.onnx", "flow.pt", "hift.pt", "default_voice.wav", "default_voice.tokens")
#: Options only this report reads, and only the Step-Audio2 report reads (`bench token2wav`'s others are shared).
COSYVOICE3_ONLY = ("full", "chunks", "hop_tokens", "baseline_at")
STEP_AUDIO2_ONLY = ("reduced", "prompt_calls")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """The options only `--family cosyvoice3` reads."""
    parser.add_argument(
        "--full",
        action="store_true",
        help="cosyvoice3: the full-size stand-in (1.4 GB, generated on first use) instead of the reduced one",
    )
    parser.add_argument("--chunks", type=int, metavar="N", help="cosyvoice3: chunks of the cost curve (default 50)")
    parser.add_argument(
        "--hop-tokens", type=int, metavar="N", help="cosyvoice3: tokens per chunk of the cost curve (default 25)"
    )
    parser.add_argument(
        "--baseline-at",
        metavar="I,J,..",
        help="cosyvoice3: chunk indices where upstream's re-run is timed (default 1,2,5,10,20,30,40,50)",
    )


def check_family_options(args: argparse.Namespace) -> None:
    """Refuse the other report's options (one line, exit 2) instead of ignoring them."""
    cosyvoice3 = args.family == "cosyvoice3"
    foreign = [
        name
        for name in (STEP_AUDIO2_ONLY if cosyvoice3 else COSYVOICE3_ONLY)
        if getattr(args, name) not in (None, False)
    ]
    if foreign:
        flags = ", ".join("--" + n.replace("_", "-") for n in foreign)
        hint = (
            "the CosyVoice3 report runs the reduced stand-in unless --full" if cosyvoice3 else "add --family cosyvoice3"
        )
        raise CLIUsageError(f"{flags}: not an option of --family {args.family} ({hint})")


def build_config(args: argparse.Namespace) -> Any:
    """The validated CosyVoice3 `BenchConfig` for `args` (raises `CLIUsageError` for user mistakes)."""
    from vllm_omni_token2wav.benchmarks.token2wav.cosyvoice3.run import BenchConfig, BenchSetupError, default_plan

    check_family_options(args)
    if args.full and args.model_dir is not None:
        raise CLIUsageError("--full selects the full-size stand-in; it cannot be combined with --model-dir")
    device = bench_cli.check_device(args.device)
    bench_cli.check_output_files(args)
    model_dir = None
    if args.model_dir is not None:
        model_dir = Path(args.model_dir).expanduser()
        missing = [name for name in MODEL_DIR_FILES if not (model_dir / name).is_file()]
        if missing:
            raise CLIUsageError(
                f"--model-dir {args.model_dir}: missing {', '.join(missing)} (a Fun-CosyVoice3 directory with the "
                "benchmark's prompt: default_voice.wav and its speech tokens in default_voice.tokens)"
            )
    device_type = "cpu" if device == "auto" and _auto_is_cpu() else device.split(":")[0]
    plan = default_plan(full=args.full, device_type=device_type, fast=args.fast)
    given = {
        "gen_seconds": args.gen_seconds,
        "prompt_seconds": args.prompt_seconds,
        "n_timesteps": args.n_timesteps,
        "runs": args.runs,
        "warmup": args.warmup,
        "chunks": args.chunks,
        "hop_tokens": args.hop_tokens,
        "baseline_at": None if args.baseline_at is None else parse_indices(args.baseline_at),
    }
    explicit = all(value is not None for value in given.values())
    sizes = {name: getattr(plan, name) if value is None else value for name, value in given.items()}
    sizes["baseline_at"] = tuple(k for k in sizes["baseline_at"] if k <= sizes["chunks"]) or (1,)
    name = "explicit" if explicit else ("fast" if args.fast else ("full-cpu" if plan.n_timesteps == 1 else "default"))
    config = BenchConfig(
        model_dir=model_dir,
        full=args.full,
        device=device,
        threads=common.default_threads() if args.threads is None else args.threads,
        seed=args.seed,
        plan=name,
        **sizes,
    )
    bench_cli.check_at_least("--threads", config.threads, 1)
    try:
        config.validate()
    except BenchSetupError as exc:
        raise CLIUsageError(str(exc)) from None
    return config


def _auto_is_cpu() -> bool:
    from vllm_omni_token2wav import platforms

    return platforms.current_omni_platform.device_type == "cpu"


def run(args: argparse.Namespace) -> int:
    config = build_config(args)
    from vllm_omni_token2wav.benchmarks.token2wav.cosyvoice3 import report as token2wav_cosyvoice3_report
    from vllm_omni_token2wav.benchmarks.token2wav.cosyvoice3.run import BenchSetupError, CosyVoice3Benchmark

    bench = CosyVoice3Benchmark(config, stage=bench_cli.stage_printer("token2wav"))
    return bench_cli.run_and_publish(
        bench,
        token2wav_cosyvoice3_report,
        BenchSetupError,
        args,
        DEFAULT_JSON,
        DEFAULT_PLOT,
        plot=lambda report: any(m.total_ms for m in report.modes) or bool(report.flow),
    )


RECORDERS = (
    bench_cli.Recorder(
        name="token2wav_cosyvoice3",
        command=("bench", "token2wav", "--family", "cosyvoice3"),
        stem=bench_cli.full_stem("token2wav_cosyvoice3"),
        summary="token2wav_cosyvoice3[_full]_<device>: CosyVoice3 code2wav RTF, first audio, cost per chunk",
    ),
)
