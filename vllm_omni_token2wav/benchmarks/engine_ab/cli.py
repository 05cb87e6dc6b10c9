# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav bench engine-ab`: vLLM-Omni's own code2wav classes vs ours, same engine, same run.

Runs `vllm_omni_token2wav.benchmarks.engine_ab.run`: per family, two `vllm-omni-token2wav serve` processes of
the family's code2wav stage alone (`--route alone`, codec ids), behind the stand-in producer (`--route
stream`, text streamed from the speech endpoint) or behind upstream's own thinker/talker at toy size (`--route
pipeline`: upstream's deploy YAML in both arms) on the same stand-in folder, one with
`VLLM_OMNI_TOKEN2WAV_OVERRIDES=0` (vLLM-Omni's class, at the `max_num_seqs` of vLLM-Omni's own deploy YAML for
the model) and one with ours (our deploy YAML, batched); the same requests alternate between them level by
level. Prints a markdown table per family (audio seconds per wall second, TTFP p50/p99, RTF, underruns,
failed requests, peak RSS of each engine's process tree), the fault wave (route alone: 8 requests, one with an
out-of-range code) and a verdict line, and writes `./out/engine_ab.json` and `./out/engine_ab.png` unless
`--json` / `--plot` say elsewhere; the JSON is rewritten after every arm's level.

An arm that does not start or fails every request is reported (status, reason, first error line of its
log), not fatal. Exit codes: 0 both arms of every family measured with no failed request; 1 otherwise; 2
usage error; 130 interrupted (the partial report is printed and its JSON written).

This module only parses options (argparse); the engine is imported inside `run`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm_omni_token2wav.benchmarks import bench_cli
from vllm_omni_token2wav.benchmarks.engine_ab.families import FAMILIES
from vllm_omni_token2wav.benchmarks.token2wav_serve.cli import parse_levels
from vllm_omni_token2wav.cli_types import CLIUsageError

DEFAULT_JSON = str(bench_cli.DEFAULT_REPORT_DIR / "engine_ab.json")
DEFAULT_PLOT = str(bench_cli.DEFAULT_REPORT_DIR / "engine_ab.png")
#: The family names the CLI takes: `run.FAMILIES` (the registered families with an upstream deployment).
FAMILY_NAMES = FAMILIES


def parse_families(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [n for n in names if n not in FAMILY_NAMES]
    if not names or unknown or len(set(names)) != len(names):
        raise CLIUsageError(f"--families {text!r}: expected distinct names of {','.join(FAMILY_NAMES)}")
    return names


def build_config(args: argparse.Namespace) -> Any:
    """The validated `EngineABConfig` for `args` (raises `CLIUsageError` before any work)."""
    bench_cli.check_output_files(args)
    bench_cli.check_at_least("--requests", args.requests, 1)
    if args.request_timeout <= 0:
        raise CLIUsageError(f"--request-timeout must be > 0, got {args.request_timeout}")
    if args.seconds is not None and not 0.2 <= args.seconds <= 60:
        raise CLIUsageError(f"--seconds must be in [0.2, 60], got {args.seconds}")
    if args.server_logs is not None and Path(args.server_logs).exists() and not Path(args.server_logs).is_dir():
        raise CLIUsageError(f"--server-logs {args.server_logs}: not a folder")
    sizes: dict[str, Any] = {}
    if args.families:
        sizes["families"] = parse_families(args.families)
    if args.concurrency:
        sizes["concurrency"] = parse_levels(args.concurrency)
    if args.requests is not None:
        sizes["requests"] = args.requests
    if args.seconds is not None:
        sizes["audio_seconds"] = args.seconds
    if args.faults is not None:
        sizes["faults"] = args.faults
    elif args.route in ("stream", "pipeline"):
        sizes["faults"] = False  # the fault wave needs codec ids in the request (route alone)

    from vllm_omni_token2wav.benchmarks.engine_ab.run import PLANS, EngineABConfig

    plan = "smoke" if args.smoke else args.plan
    config = EngineABConfig(
        **{**PLANS[plan], **sizes},
        route=args.route,
        full_size=args.full_size,
        request_timeout_s=args.request_timeout,
        seed=args.seed,
        plan=plan,
        server_logs=None if args.server_logs is None else Path(args.server_logs).expanduser(),
    )
    try:
        config.validate()
    except ValueError as exc:
        raise CLIUsageError(str(exc)) from None
    from vllm_omni_token2wav.benchmarks.token2wav_serve.engine import ENGINE_INSTALL_HINT, missing_engine

    missing = missing_engine()
    if missing:
        raise CLIUsageError(f"bench engine-ab needs {missing}, which this environment lacks; {ENGINE_INSTALL_HINT}")
    return config


class EngineABSubcommand:
    name = "engine-ab"
    help = "vLLM-Omni's own code2wav classes vs ours in the real engine: throughput, TTFP, RSS, faults"

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--families", metavar="F,F", help=f"families to compare (default {','.join(FAMILY_NAMES)})")
        parser.add_argument(
            "--route",
            choices=("alone", "stream", "pipeline"),
            default="alone",
            help="alone: the code2wav stage alone, codec ids to /v1/completions (default); stream: the stand-in "
            "producer in front, text streamed from /v1/audio/speech (step_audio2, cosyvoice3; no fault wave); "
            "pipeline: upstream's own pipeline at toy size (its YAML, thinker/talker with random weights) in both "
            "arms, text streamed from the speech or chat endpoint (step_audio2, minicpmo_4_5; no fault wave)",
        )
        parser.add_argument(
            "--full-size",
            action="store_true",
            help="serve the full-size stand-in folders (default: reduced; Step-Audio2 and MiniCPM-o with the parts "
            "upstream hard-codes at full size); CosyVoice3's upstream class loads only the full size",
        )
        parser.add_argument("--concurrency", metavar="C,C", help="concurrency levels (default 1,4,8)")
        parser.add_argument("--requests", type=int, metavar="N", help="requests per level and arm (default c, >= 2)")
        parser.add_argument("--seconds", type=float, metavar="S", help="audio seconds per request (default 2)")
        parser.add_argument(
            "--faults",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="run the fault wave (8 requests, one out-of-range code) per arm (default on; off with --smoke)",
        )
        parser.add_argument(
            "--plan",
            choices=("cpu", "accelerator"),
            default="cpu",
            help="sizes: cpu (c = 1,4,8, 2 s) or accelerator (c = 1,4,8,16,32, 4 s); explicit options win",
        )
        parser.add_argument("--smoke", action="store_true", help="c = 1, 2 short requests per arm, no faults (tests)")
        parser.add_argument(
            "--request-timeout",
            type=float,
            default=300.0,
            metavar="S",
            help="seconds a request may take before it counts as failed (default 300; full size on a CPU needs more)",
        )
        parser.add_argument("--seed", type=int, default=0, help="the requests' codes")
        parser.add_argument("--server-logs", metavar="DIR", help="keep the servers' logs in DIR/<family>/")
        bench_cli.add_report_file_options(parser, DEFAULT_JSON, DEFAULT_PLOT)

    def run(self, args: argparse.Namespace) -> int:
        config = build_config(args)
        from vllm_omni_token2wav.benchmarks.engine_ab import report as engine_ab_report
        from vllm_omni_token2wav.benchmarks.engine_ab.run import EngineABBenchmark, EngineABSetupError

        json_path = Path(args.json or DEFAULT_JSON)
        bench = EngineABBenchmark(
            config,
            stage=bench_cli.stage_printer("engine-ab"),
            on_update=lambda report: engine_ab_report.write_json(report, json_path),
        )
        return bench_cli.run_and_publish(
            bench,
            engine_ab_report,
            EngineABSetupError,
            args,
            json_path,
            DEFAULT_PLOT,
            plot=engine_ab_report.plottable,
            failed=lambda report: report.failed(),
        )


SUBCOMMAND = EngineABSubcommand()


def stem_for(argv: Sequence[str]) -> str:
    """`engine_ab[_stream|_pipeline][_<families>][_full]`: the default (route alone, every family) keeps the plain
    name."""
    families = bench_cli.option_value(argv, "--families")
    route = bench_cli.option_value(argv, "--route")
    return (
        "engine_ab"
        + (f"_{route}" if route in ("stream", "pipeline") else "")
        + ("" if families is None else "_" + families.replace(",", "_"))
        + ("_full" if "--full-size" in argv else "")
    )


RECORDERS = (
    bench_cli.Recorder(
        name="engine_ab",
        command=("bench", "engine-ab"),
        stem=stem_for,
        summary="engine_ab[_stream|_pipeline][_<families>][_full]_<device>: vLLM-Omni's code2wav classes vs ours, "
        "real engine",
        recorded_codes=(0, 1),
    ),
)
