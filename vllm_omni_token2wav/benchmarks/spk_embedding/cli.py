# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav bench spk-embedding`: does the device speaker embedding match onnxruntime, and how fast is it?

The README's first command. With no options it measures the embedded default: a deterministic
full-size stand-in `campplus.onnx` (generated on first use and cached under
`vllm_omni_token2wav.envs.cache_dir("campplus")`) on the project's speech clip, on the serving device. It
prints a table ending in a one-line verdict, and writes `out/spk_embedding_report.json` and
`out/spk_embedding_report.png` (`./out/` is git-ignored) unless `--json` / `--plot` say elsewhere.
An `--onnx` file is checked to be a CAM++ export before any work starts.

Exit codes: 0 done; 1 some backend is outside the parity tolerance against onnxruntime; 2 usage
error (bad option, unusable file, unavailable backend); 130 interrupted (the partial report is
printed and its JSON written).

This module only parses options (argparse); torch, onnxruntime, onnx and matplotlib are imported
inside `run` (and the `--onnx` check), so `vllm-omni-token2wav --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from vllm_omni_token2wav.benchmarks import bench_cli, common
from vllm_omni_token2wav.cli_types import CLIUsageError

BACKEND_CHOICES = ("ort", "torch", "trt")
DEFAULT_JSON = str(bench_cli.DEFAULT_REPORT_DIR / "spk_embedding_report.json")
DEFAULT_PLOT = str(bench_cli.DEFAULT_REPORT_DIR / "spk_embedding_report.png")
MIN_FRAMES = 4
# (lengths, warmup, iters, prompt-cache hits) of the default run and of --fast; explicit options win.
DEFAULT_PLAN = ((97, 200, 501, 1000, 3000), 5, 50, 200)
FAST_PLAN = ((97, 200), 2, 10, 50)


def parse_backends(text: str) -> tuple[str, ...]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise CLIUsageError("--backends needs at least one of ort, torch, trt (comma separated)")
    unknown = [n for n in names if n not in BACKEND_CHOICES]
    if unknown:
        raise CLIUsageError(
            f"--backends: unknown backend(s) {', '.join(unknown)}; choose from {', '.join(BACKEND_CHOICES)}"
        )
    if len(set(names)) != len(names):
        raise CLIUsageError(f"--backends lists a backend twice: {text!r}")
    # onnxruntime is the reference every ratio and parity number is computed against.
    return tuple(["ort"] + [n for n in names if n != "ort"])


def _int_list(option: str, text: str, what: str, example: str) -> list[int]:
    """The comma-separated integers of `option` (blank parts skipped); a usage error names a bad part."""
    values = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            values.append(int(part))
        except ValueError:
            raise CLIUsageError(f"{option}: {part!r} is not an integer {what} (e.g. {option} {example})") from None
    if not values:
        raise CLIUsageError(f"{option} needs at least one {what}, e.g. {option} {example}")
    return values


def parse_lengths(text: str) -> tuple[int, ...]:
    values = _int_list("--lengths", text, "frame count", "97,200,501,1000")
    for value in values:
        if value < MIN_FRAMES:
            raise CLIUsageError(f"--lengths: T={value} is too short; CAM++ needs at least {MIN_FRAMES} frames")
    return tuple(sorted(set(values)))


def parse_threads(text: str | None) -> tuple[int, ...]:
    """`--threads 1,2` -> (1, 2); default: 1 and the usable cores (at most 8), e.g. (1, 2) on 2 cores."""
    if text is None:
        return tuple(sorted({1, common.default_threads()}))
    values = _int_list("--threads", text, "thread count", "1,2")
    for value in values:
        if value < 1:
            raise CLIUsageError(f"--threads must be >= 1, got {value}")
    return tuple(sorted(set(values)))


def _existing_file(option: str, value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.exists():
        raise CLIUsageError(f"{option} {value}: no such file")
    if not path.is_file():
        raise CLIUsageError(f"{option} {value}: not a regular file")
    return path


def _campplus_file(value: str | None) -> Path | None:
    """`--onnx`, checked to exist and to be a CAM++ export before anything is measured (one line, one path)."""
    path = _existing_file("--onnx", value)
    if path is None:
        return None
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.onnx_import import (
        CampplusOnnxError,
        check_campplus_export,
    )

    try:
        check_campplus_export(path)
    except CampplusOnnxError as exc:
        raise CLIUsageError(f"--onnx {exc}") from None
    return path


def build_config(args: argparse.Namespace) -> Any:
    """The validated `BenchConfig` for `args` (raises `CLIUsageError` for user mistakes)."""
    from vllm_omni_token2wav.benchmarks.spk_embedding.run import BenchConfig

    plan = FAST_PLAN if args.fast else DEFAULT_PLAN
    for name in ("batch", "iters"):
        bench_cli.check_at_least(f"--{name}", getattr(args, name), 1)
    bench_cli.check_at_least("--warmup", args.warmup, 0)
    device = bench_cli.check_device(args.device)
    if args.backends is None:
        backends: tuple[str, ...] = ("ort", "torch")
    else:
        backends = parse_backends(args.backends)
    lengths = parse_lengths(args.lengths) if args.lengths is not None else plan[0]
    if "trt" in backends and max(lengths) > 3000:
        raise CLIUsageError(f"--lengths: T={max(lengths)} exceeds the TensorRT profile (4..3000 frames)")
    bench_cli.check_output_files(args)
    audio = _existing_file("--audio", args.audio)
    return BenchConfig(
        onnx=_campplus_file(args.onnx),
        device=device,
        backends=backends,
        lengths=lengths,
        batch=args.batch,
        warmup=plan[1] if args.warmup is None else args.warmup,
        iters=plan[2] if args.iters is None else args.iters,
        threads=parse_threads(args.threads),
        audio=audio,
        prompt_cache_iters=plan[3],
        add_trt_when_available=args.backends is None,
    )


class _CliProgress:
    """`Progress` for the CLI: setup steps as lines on stderr, the timed loop through `benchmarks.progress`
    (a bar on a terminal, removed before the table is printed; plain periodic lines in a log)."""

    def __init__(self) -> None:
        self._bar: Any = None

    def stage(self, text: str) -> None:
        self._write(f"[spk-embedding] {text} ...")

    def start(self, total: int) -> None:
        from vllm_omni_token2wav.benchmarks.progress import progress

        self._bar = progress(total, "[spk-embedding] timing", "call")

    def advance(self, calls: int, text: str) -> None:
        if self._bar is not None:
            self._bar.update(calls)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _write(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, file=sys.stderr, flush=True)


class SpkEmbeddingSubcommand:
    name = "spk-embedding"
    help = "CAM++ speaker embedding: parity with onnxruntime and latency of each backend, side by side"

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--onnx",
            metavar="PATH",
            help="campplus.onnx to measure (default: a deterministic full-size stand-in, generated on first use "
            "and cached under the vllm_omni_token2wav cache folder; its embeddings are not a real speaker space)",
        )
        bench_cli.add_device_option(parser)
        parser.add_argument(
            "--backends",
            metavar="LIST",
            help="comma-separated from ort,torch,trt (default ort,torch, plus trt on CUDA hosts with TensorRT); "
            "ort is always measured: it is the reference",
        )
        parser.add_argument(
            "--lengths", metavar="T,...", help="feature lengths in fbank frames (default 97,200,501,1000,3000)"
        )
        parser.add_argument("--batch", type=int, default=1, help="utterances per call (default 1)")
        parser.add_argument("--warmup", type=int, metavar="N", help="untimed calls per backend and T (default 5)")
        parser.add_argument("--iters", type=int, metavar="N", help="timed calls per backend and T (default 50)")
        parser.add_argument(
            "--threads",
            metavar="N,...",
            help="thread budgets: every backend runs at each (torch intra-op threads and onnxruntime intra-op "
            f"threads per call; default 1 and the usable cores, <= {common.MAX_DEFAULT_THREADS})",
        )
        parser.add_argument("--audio", metavar="PATH", help="speech file to cut features from (default: shipped clip)")
        bench_cli.add_report_file_options(parser, DEFAULT_JSON, DEFAULT_PLOT)
        parser.add_argument(
            "--fast",
            action="store_true",
            help="quick look: T 97,200, 2 warm-up + 10 timed calls (explicit options win)",
        )

    def run(self, args: argparse.Namespace) -> int:
        config = build_config(args)
        from vllm_omni_token2wav.benchmarks.spk_embedding import report as spk_embedding_report
        from vllm_omni_token2wav.benchmarks.spk_embedding.run import BenchSetupError, SpkEmbeddingBenchmark

        progress = _CliProgress()
        return bench_cli.run_and_publish(
            SpkEmbeddingBenchmark(config, progress),
            spk_embedding_report,
            BenchSetupError,
            args,
            DEFAULT_JSON,
            DEFAULT_PLOT,
            plot=lambda report: bool(report.results),
            failed=lambda report: bool(report.parity_failures),  # a backend outside the parity tolerance
            after_run=progress.close,
        )


SUBCOMMAND = SpkEmbeddingSubcommand()


RECORDERS = (
    bench_cli.Recorder(
        name="spk_embedding",
        command=("bench", "spk-embedding"),
        stem=bench_cli.fixed_stem("spk_embedding"),
        summary="spk_embedding_<device>: CAM++ parity and latency (a parity mismatch, exit 1, is recorded too)",
        recorded_codes=(0, 1),
    ),
)
