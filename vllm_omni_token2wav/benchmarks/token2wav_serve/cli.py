# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav bench token2wav-serve`: what concurrency costs the Token2Wav stage, and what batching buys.

Runs `vllm_omni_token2wav.benchmarks.token2wav_serve.run`: the stage model driven as vLLM-Omni's runner drives it
(many requests, chunks of 25 + 3 codes as a talker emits them, one `forward` per scheduler step),
at each concurrency level, batched and one-request-per-forward in the same run. Prints a table
(TTFP, audio RTF, underruns, audio seconds per wall second, p50/p90/p99, the batched/unbatched
ratio) and writes `./out/token2wav_serve.json` and `./out/token2wav_serve.png` unless `--json` /
`--plot` say elsewhere.

Sizes come from a plan (explicit options win): on CPU the reduced stand-in at c = 1, 4, 8
(`cpu`, under 3 minutes on 2 cores); `--full` the full-size stand-in at c = 1, 2, 4 (`cpu-full`);
on an accelerator c = 1, 8, 32 (`accelerator`); `--smoke` a seconds-long run for tests.
On CPU with the reduced stand-in the default is 1 torch thread: its ops are too small to gain from
more, and on a shared 2-core host 2 threads measured slower.

`--engine` measures the real served stack instead (`engine.py` beside this module): the
stand-in producer feeding our Step-Audio2 code2wav in `vllm-omni-token2wav serve` on loopback,
code2wav `max_num_seqs` = the largest level vs 1 (two servers), with the emulated run of the same
work beside it; reports go to `./out/token2wav_serve_engine.{json,png}`. Options that only shape the
emulated stage (`--talker-rate`, `--voices`, `--threads`, ...) are usage errors there, named with why.

`--engine --soak` keeps one server up for many requests (`soak.py` beside this module): `--requests`
(default 1,000) streamed requests at one `--concurrency` (default 8), then a burst (`--burst-requests`
128 at `--burst-concurrency` 64); it reports failures (the exit code is 1 unless there are none), the
server tree's RSS over time and its least-squares slope, and TTFP per `--window` requests, to
`./out/token2wav_serve_soak.{json,png}` (the JSON rewritten after every window).

`--engine --edge shm,mooncake` serves the same stack once per code2wav edge, one server after the other
(`edges.py` beside this module): SharedMemory, and Mooncake's transfer engine over TCP on loopback (the YAML
`connectors:` edge; the `multinode` extra), at `--concurrency` (default 1,4,8): TTFP p50/p99, audio s/s and the
per-chunk transfer time timed around the connectors' put / get in the engine processes, against issue 35's
targets; reports go to `./out/token2wav_serve_edges.{json,png}`.

Exit codes: 0 done; 1 some segment failed (the table says which); 2 usage error; 130 interrupted
(the partial report is printed and its JSON written).

This module only parses options (argparse); torch and the models are imported inside `run`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vllm_omni_token2wav.benchmarks import bench_cli, common
from vllm_omni_token2wav.benchmarks.token2wav_serve.families import FAMILIES, FAMILY_ALIASES, canonical_family
from vllm_omni_token2wav.cli_types import CLIUsageError

DEFAULT_JSON = str(bench_cli.DEFAULT_REPORT_DIR / "token2wav_serve.json")
DEFAULT_PLOT = str(bench_cli.DEFAULT_REPORT_DIR / "token2wav_serve.png")
ENGINE_JSON = str(bench_cli.DEFAULT_REPORT_DIR / "token2wav_serve_engine.json")
ENGINE_PLOT = str(bench_cli.DEFAULT_REPORT_DIR / "token2wav_serve_engine.png")
EDGES_JSON = str(bench_cli.DEFAULT_REPORT_DIR / "token2wav_serve_edges.json")
EDGES_PLOT = str(bench_cli.DEFAULT_REPORT_DIR / "token2wav_serve_edges.png")
SOAK_JSON = str(bench_cli.DEFAULT_REPORT_DIR / "token2wav_serve_soak.json")
SOAK_PLOT = str(bench_cli.DEFAULT_REPORT_DIR / "token2wav_serve_soak.png")
#: Options of `--engine` that `--soak` refuses, and why.
SOAK_REFUSED = {
    "request_rate": "the soak is a closed loop at --concurrency, then the burst",
    "clock": "the soak runs no in-process comparison",
}
#: Options only `--soak` takes.
SOAK_ONLY = ("burst_requests", "burst_concurrency", "window")
FAMILY_CHOICES = (*FAMILIES, *FAMILY_ALIASES)
DEFAULT_TALKER_RATE = 100.0
#: Options of the emulated run that `--engine` refuses, and why (the served stack decides these itself).
ENGINE_REFUSED = {
    "model_dir": "the served stack runs the stand-in engine model folder",
    "full": "the served stack runs the reduced stand-in",
    "talker_rate": "the served producer runs at its own rate (reported per level; the in-process run follows it)",
    "voices": "the speech endpoint serves this model with its default voice only",
    "n_timesteps": "the served stage uses its deployment's setting",
    "reference_seconds": "the served stage uses its deployment's setting",
    "kv_cache_dtype": "the served stage uses its deployment's setting",
    "threads": "the in-process comparison uses the engine worker's torch thread count",
}
KV_DTYPES = ("float32", "float16", "bfloat16")


def parse_levels(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise CLIUsageError(f"--concurrency {text!r}: expected comma-separated ints like 1,4,8") from None
    if not values or any(v < 1 for v in values) or len(set(values)) != len(values):
        raise CLIUsageError(f"--concurrency {text!r}: expected distinct levels >= 1 like 1,4,8")
    return values


def parse_seconds_range(text: str) -> tuple[float, float]:
    parts = text.split("-")
    try:
        lo, hi = (float(parts[0]), float(parts[-1])) if len(parts) <= 2 else (None, None)
    except ValueError:
        lo = hi = None
    if lo is None or hi is None or not 0.2 <= lo <= hi <= 120:
        raise CLIUsageError(f"--audio-seconds {text!r}: expected S or MIN-MAX with 0.2 <= MIN <= MAX <= 120")
    return lo, hi


def add_clock_option(parser: argparse.ArgumentParser, default: str | None = "wall", extra_help: str = "") -> None:
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default=default,
        help="time a step by the wall clock (default) or, on CPU with 1 thread, by the thread's CPU time "
        "(a shared host: the step's cost without the time other processes held the core)" + extra_help,
    )


def _plan_name(args: argparse.Namespace, device_type: str) -> str:
    if args.smoke:
        return "smoke"
    if device_type != "cpu":
        return "accelerator"
    return "cpu-full" if args.full else "cpu"


def build_config(args: argparse.Namespace) -> Any:
    """The validated `ServeConfig` for `args` (raises `CLIUsageError` for user mistakes)."""
    if args.server_logs is not None:
        raise CLIUsageError("--server-logs keeps the servers' logs of an --engine run; add --engine")
    if args.full and args.model_dir is not None:
        raise CLIUsageError("--full selects the full-size stand-in; it cannot be combined with --model-dir")
    device = bench_cli.check_device(args.device)
    bench_cli.check_output_files(args)
    for option, low in (("requests", 1), ("voices", 0), ("n_timesteps", 1), ("max_num_seqs", 1), ("threads", 1)):
        bench_cli.check_at_least("--" + option.replace("_", "-"), getattr(args, option), low)
    for option in ("request_rate", "talker_rate", "reference_seconds"):
        value = getattr(args, option)
        if value is not None and not value > 0:
            raise CLIUsageError(f"--{option.replace('_', '-')} must be > 0, got {value}")
    model_dir = None
    if args.model_dir is not None:
        model_dir = Path(args.model_dir).expanduser()
        if not model_dir.is_dir():
            raise CLIUsageError(f"--model-dir {args.model_dir}: no such directory")

    from vllm_omni_token2wav.benchmarks.token2wav.cli import resolved_device_type
    from vllm_omni_token2wav.benchmarks.token2wav_serve.run import PLANS, ServeConfig

    device_type = resolved_device_type(device)
    if args.clock == "cpu" and device_type != "cpu":
        raise CLIUsageError(f"--clock cpu times CPU runs only; --device {device} runs on {device_type}")
    plan = _plan_name(args, device_type)
    sizes: dict[str, Any] = dict(PLANS[plan])
    explicit = {
        "concurrency": parse_levels(args.concurrency) if args.concurrency else None,
        "requests": args.requests,
        "audio_seconds": parse_seconds_range(args.audio_seconds) if args.audio_seconds else None,
        "voices": args.voices,
        "n_timesteps": args.n_timesteps,
        "reference_seconds": args.reference_seconds,
    }
    sizes.update({k: v for k, v in explicit.items() if v is not None})
    reduced_cpu = device_type == "cpu" and not args.full and model_dir is None
    threads = args.threads if args.threads is not None else (1 if reduced_cpu else common.default_threads())
    config = ServeConfig(
        model_dir=model_dir,
        full=args.full,
        family=canonical_family(args.family) if args.family else FAMILIES[0],
        device=device,
        request_rate=args.request_rate,
        talker_rate=DEFAULT_TALKER_RATE if args.talker_rate is None else args.talker_rate,
        max_num_seqs=args.max_num_seqs,
        kv_cache_dtype=args.kv_cache_dtype,
        threads=threads,
        seed=args.seed,
        plan=plan,
        clock=args.clock or "wall",
        **sizes,
    )
    try:
        config.validate()
    except ValueError as exc:
        raise CLIUsageError(str(exc)) from None
    return config


class Token2WavServeSubcommand:
    name = "token2wav-serve"
    help = "Token2Wav stage under concurrent load: TTFP, RTF, underruns, throughput, batched vs unbatched"

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--model-dir", metavar="DIR", help="model or token2wav folder (default: the reduced stand-in)"
        )
        parser.add_argument("--full", action="store_true", help="use the full-size stand-in (~1.2 GB, slow on CPU)")
        parser.add_argument(
            "--family",
            choices=FAMILY_CHOICES,
            help=f"stage model (default {FAMILIES[0]}; --engine: step_audio2; {', '.join(FAMILY_ALIASES)}: old names)",
        )
        bench_cli.add_device_option(parser)
        parser.add_argument(
            "--concurrency", metavar="C,C", help="concurrency levels (default 1,4,8; accelerator 1,8,32)"
        )
        parser.add_argument("--requests", type=int, metavar="N", help="requests per level (default 3 x c, >= 4)")
        parser.add_argument(
            "--request-rate", type=float, metavar="R", help="Poisson arrivals per second (default: closed loop)"
        )
        parser.add_argument("--talker-rate", type=float, metavar="T", help="codes/s per request (25 = real time; 100)")
        parser.add_argument("--audio-seconds", metavar="MIN-MAX", help="audio per request (default 2-4)")
        parser.add_argument("--voices", type=int, metavar="N", help="reference voices besides the default (3)")
        parser.add_argument("--n-timesteps", type=int, metavar="N", help="flow-matching Euler steps (default 10)")
        parser.add_argument("--reference-seconds", type=float, metavar="S", help="prompt length (default 6)")
        parser.add_argument("--max-num-seqs", type=int, metavar="N", help="rows per batched forward (default c)")
        parser.add_argument(
            "--kv-cache-dtype", choices=KV_DTYPES, help="estimator cache storage dtype (default: the flow's)"
        )
        bench_cli.add_threads_option(parser)
        parser.add_argument("--seed", type=int, default=0, help="stand-in weights, codes, lengths and noise seed")
        add_clock_option(
            parser,
            None,
            "; --engine: the in-process comparison's steps, default cpu (the served stack is timed by "
            "the client's wall clock)",
        )
        parser.add_argument("--smoke", action="store_true", help="a seconds-long run (tests); explicit options win")
        parser.add_argument(
            "--engine",
            action="store_true",
            help="measure the real served stack (stand-in producer -> our code2wav in vllm-omni-token2wav serve, "
            "loopback), code2wav max_num_seqs = largest level vs 1, beside the in-process run of the same work",
        )
        parser.add_argument(
            "--edge",
            metavar="E,E",
            help="with --engine: compare the code2wav edge on shm (SharedMemory) and mooncake (Mooncake TE over tcp "
            "loopback; the multinode extra), one server at a time, at --concurrency (default 1,4,8): TTFP, "
            "throughput, per-chunk transfer time",
        )
        parser.add_argument("--server-logs", metavar="DIR", help="--engine: keep the servers' logs in DIR")
        parser.add_argument(
            "--soak",
            action="store_true",
            help="with --engine: one server, --requests (default 1000) streamed requests at --concurrency (default "
            "8), then a burst; failures (must be 0), the server's RSS and its slope, TTFP per window",
        )
        parser.add_argument("--burst-requests", type=int, metavar="N", help="--soak: requests of the burst (128)")
        parser.add_argument("--burst-concurrency", type=int, metavar="C", help="--soak: the burst's concurrency (64)")
        parser.add_argument("--window", type=int, metavar="N", help="--soak: requests per TTFP window (100)")
        bench_cli.add_report_file_options(parser, DEFAULT_JSON, DEFAULT_PLOT)

    def run(self, args: argparse.Namespace) -> int:
        if args.soak:
            if args.edge is not None:
                raise CLIUsageError("--edge compares two edges over levels; it cannot be combined with --soak")
            return run_soak(args)
        for option in SOAK_ONLY:
            if getattr(args, option) is not None:
                raise CLIUsageError(f"--{option.replace('_', '-')} shapes a soak run; add --engine --soak")
        if args.edge is not None:
            return run_edges(args)
        if args.engine:
            return run_engine(args)
        config = build_config(args)
        from vllm_omni_token2wav.benchmarks.token2wav_serve import report as token2wav_serve_report
        from vllm_omni_token2wav.benchmarks.token2wav_serve.run import ServeSetupError, Token2WavServeBenchmark

        bench = Token2WavServeBenchmark(config, stage=bench_cli.stage_printer("token2wav-serve"))
        return bench_cli.run_and_publish(
            bench,
            token2wav_serve_report,
            ServeSetupError,
            args,
            DEFAULT_JSON,
            DEFAULT_PLOT,
            plot=lambda report: bool(report.runs),
            failed=lambda report: any(run.summary()["errors"] for run in report.runs.values()),
        )


#: Why `--audio-seconds` takes one value under `--engine`, and under `--soak` / `--edge`.
ONE_LENGTH_ENGINE = (
    "--engine gives every reply one length (the producer's max_tokens; the speech endpoint has no per-request "
    "length for this model)"
)
ONE_LENGTH_SERVED = "the served stack gives every reply one length"


def _check_served_args(
    args: argparse.Namespace,
    mode: str,
    refused: dict[str, str],
    *,
    family_why: str,
    at_least: Sequence[tuple[str, int]],
) -> None:
    """What `--engine`, `--engine --soak` and `--engine --edge` all check before any work (`mode` names the one
    running in the messages): refused options, the served family, the device, output files, the lower bounds, and
    that `--server-logs` is a folder."""
    for option, why in refused.items():
        value = getattr(args, option)
        if value not in (None, False):
            raise CLIUsageError(f"--{option.replace('_', '-')} does not apply to {mode}: {why}")
    if args.family is not None and canonical_family(args.family) != "step_audio2":
        raise CLIUsageError(f"--family {args.family} does not apply to {mode}: {family_why}")
    if bench_cli.check_device(args.device) not in ("auto", "cpu"):
        raise CLIUsageError(f"--device {args.device} does not apply to --engine: the engine serves on its platform")
    bench_cli.check_output_files(args)
    for option, low in at_least:
        bench_cli.check_at_least("--" + option.replace("_", "-"), getattr(args, option), low)
    if args.server_logs is not None and Path(args.server_logs).exists() and not Path(args.server_logs).is_dir():
        raise CLIUsageError(f"--server-logs {args.server_logs}: not a folder")


def _require_engine(mode: str) -> None:
    from vllm_omni_token2wav.benchmarks.token2wav_serve.engine import ENGINE_INSTALL_HINT, missing_engine

    missing = missing_engine()
    if missing:
        raise CLIUsageError(f"{mode} needs {missing}, which this environment lacks; {ENGINE_INSTALL_HINT}")


def _one_audio_seconds(args: argparse.Namespace, why: str) -> float | None:
    """`--audio-seconds` as the one reply length the served stack can give (None: the plan's)."""
    if not args.audio_seconds:
        return None
    lo, hi = parse_seconds_range(args.audio_seconds)
    if lo != hi:
        raise CLIUsageError(f"--audio-seconds {args.audio_seconds}: {why}; give one value")
    return lo


def _server_logs_dir(args: argparse.Namespace) -> Path | None:
    return None if args.server_logs is None else Path(args.server_logs).expanduser()


def build_engine_config(args: argparse.Namespace) -> Any:
    """The validated `EngineServeConfig` for `--engine` (raises `CLIUsageError` before any work)."""
    _check_served_args(
        args,
        "--engine",
        ENGINE_REFUSED,
        family_why="the served stand-in stack is Step-Audio2's "
        "(MiniCPM-o's talker hands codes over in a way the stand-in producer does not emulate)",
        at_least=(("requests", 1), ("max_num_seqs", 1)),
    )
    if args.request_rate is not None and not args.request_rate > 0:
        raise CLIUsageError(f"--request-rate must be > 0, got {args.request_rate}")
    _require_engine("--engine")
    from vllm_omni_token2wav.benchmarks.token2wav_serve.engine import PLANS, EngineServeConfig

    plan = "engine-smoke" if args.smoke else "engine"
    sizes: dict[str, Any] = dict(PLANS[plan])
    if args.concurrency:
        sizes["concurrency"] = parse_levels(args.concurrency)
    if args.requests is not None:
        sizes["requests"] = args.requests
    if (seconds := _one_audio_seconds(args, ONE_LENGTH_ENGINE)) is not None:
        sizes["audio_seconds"] = seconds
    config = EngineServeConfig(
        request_rate=args.request_rate,
        max_num_seqs=args.max_num_seqs,
        seed=args.seed,
        in_process_clock=args.clock or "cpu",
        plan=plan,
        server_logs=_server_logs_dir(args),
        **sizes,
    )
    try:
        config.validate()
    except ValueError as exc:
        raise CLIUsageError(str(exc)) from None
    return config


def _serve_and_publish(
    bench: Any,
    setup_error: type[Exception],
    report_module: Any,
    json_path: Path,
    plot_path: Path,
    *,
    has_plot: Callable[[Any], bool],
    note_failure: bool,
) -> int:
    """Run a served benchmark (`--engine`, `--soak`, `--edge`) and publish its report: a server that failed to start
    or serve is one stderr line (`note_failure`: also a note in the report) and exit code 1, never a traceback."""
    from vllm_omni_token2wav.benchmarks.engine_server import EngineServerError

    bench.report.command = bench_cli.invoked_command()
    failed_to_serve = False
    try:
        interrupted = bench_cli.run_benchmark(bench.run, setup_error)
    except EngineServerError as exc:  # the message says which server and where its log is
        print(f"vllm-omni-token2wav: {exc}", file=sys.stderr)
        if note_failure:
            bench.report.notes.append(f"server failure: {str(exc).splitlines()[0]}")
        interrupted, failed_to_serve = False, True
    report = bench.report
    return bench_cli.publish_report(
        report,
        report_module,
        json_path,
        plot_path,
        plot=has_plot(report),
        interrupted=interrupted,
        code=1 if failed_to_serve or report.failed() else 0,
    )


def run_engine(args: argparse.Namespace) -> int:
    config = build_engine_config(args)
    from vllm_omni_token2wav.benchmarks.token2wav_serve import engine_report as token2wav_serve_engine_report
    from vllm_omni_token2wav.benchmarks.token2wav_serve.engine import EngineServeBenchmark, EngineServeSetupError

    bench = EngineServeBenchmark(config, stage=bench_cli.stage_printer("token2wav-serve --engine"))
    return _serve_and_publish(
        bench,
        EngineServeSetupError,
        token2wav_serve_engine_report,
        Path(args.json or ENGINE_JSON),
        Path(args.plot or ENGINE_PLOT),
        has_plot=lambda report: bool(report.served),
        note_failure=False,
    )


def build_soak_config(args: argparse.Namespace) -> Any:
    """The validated `SoakConfig` for `--engine --soak` (raises `CLIUsageError` before any work)."""
    if not args.engine:
        raise CLIUsageError("--soak runs through the real served stack; add --engine")
    _check_served_args(
        args,
        "--engine --soak",
        {**ENGINE_REFUSED, **SOAK_REFUSED},
        family_why="the served stack is Step-Audio2's",
        at_least=(("requests", 1), ("max_num_seqs", 1), ("burst_requests", 0), ("burst_concurrency", 1), ("window", 1)),
    )
    _require_engine("--engine --soak")
    from vllm_omni_token2wav.benchmarks.token2wav_serve.soak import PLANS, SoakConfig

    plan = "soak-smoke" if args.smoke else "soak"
    sizes: dict[str, Any] = dict(PLANS[plan])
    if args.concurrency:
        levels = parse_levels(args.concurrency)
        if len(levels) != 1:
            raise CLIUsageError(f"--concurrency {args.concurrency}: --soak sustains one level; give one value like 8")
        sizes["concurrency"] = levels[0]
    if (seconds := _one_audio_seconds(args, ONE_LENGTH_SERVED)) is not None:
        sizes["audio_seconds"] = seconds
    for option in ("requests", "burst_requests", "burst_concurrency", "window", "max_num_seqs"):
        if getattr(args, option) is not None:
            sizes[option] = getattr(args, option)
    config = SoakConfig(seed=args.seed, plan=plan, server_logs=_server_logs_dir(args), **sizes)
    try:
        config.validate()
    except ValueError as exc:
        raise CLIUsageError(str(exc)) from None
    return config


def run_soak(args: argparse.Namespace) -> int:
    config = build_soak_config(args)
    from vllm_omni_token2wav.benchmarks.token2wav_serve import soak_report
    from vllm_omni_token2wav.benchmarks.token2wav_serve.soak import SoakBenchmark, SoakSetupError

    json_path = Path(args.json or SOAK_JSON)
    bench = SoakBenchmark(
        config,
        stage=bench_cli.stage_printer("token2wav-serve --engine --soak"),
        checkpoint=lambda report: soak_report.write_json(report, json_path),  # after each window: a partial report
    )
    return _serve_and_publish(
        bench,
        SoakSetupError,
        soak_report,
        json_path,
        Path(args.plot or SOAK_PLOT),
        has_plot=lambda report: bool(report.requests),
        note_failure=True,
    )


#: Options of `--engine` that `--edge` refuses, and why.
EDGE_REFUSED = {
    "request_rate": "the edge comparison is a closed loop at each --concurrency",
    "max_num_seqs": "both edges serve the shipped deployment's max_num_seqs",
    "clock": "the edge comparison runs no in-process comparison",
}


def build_edge_config(args: argparse.Namespace) -> Any:
    """The validated `EdgeConfig` for `--engine --edge` (raises `CLIUsageError` before any work)."""
    if not args.engine:
        raise CLIUsageError("--edge compares served deployments; add --engine")
    _check_served_args(
        args,
        "--engine --edge",
        {**ENGINE_REFUSED, **EDGE_REFUSED},
        family_why="the served stack is Step-Audio2's",
        at_least=(("requests", 1),),
    )
    _require_engine("--engine --edge")
    from vllm_omni_token2wav.benchmarks.token2wav_serve.edges import PLANS, EdgeConfig, missing_mooncake, parse_edges

    edges = parse_edges(args.edge)
    if "mooncake" in edges and (lacking := missing_mooncake()):
        raise CLIUsageError(f"--edge mooncake needs {lacking}, which this environment lacks")
    plan = "edges-smoke" if args.smoke else "edges"
    sizes: dict[str, Any] = dict(PLANS[plan])
    if args.concurrency:
        sizes["concurrency"] = parse_levels(args.concurrency)
    if args.requests is not None:
        sizes["requests"] = args.requests
    if (seconds := _one_audio_seconds(args, ONE_LENGTH_SERVED)) is not None:
        sizes["audio_seconds"] = seconds
    config = EdgeConfig(edges=edges, seed=args.seed, plan=plan, server_logs=_server_logs_dir(args), **sizes)
    try:
        config.validate()
    except ValueError as exc:
        raise CLIUsageError(f"--edge {args.edge}: {exc}") from None
    return config


def run_edges(args: argparse.Namespace) -> int:
    config = build_edge_config(args)
    from vllm_omni_token2wav.benchmarks.token2wav_serve import edges_report
    from vllm_omni_token2wav.benchmarks.token2wav_serve.edges import EdgeBenchmark, EdgeSetupError

    bench = EdgeBenchmark(config, stage=bench_cli.stage_printer("token2wav-serve --engine --edge"))
    return _serve_and_publish(
        bench,
        EdgeSetupError,
        edges_report,
        Path(args.json or EDGES_JSON),
        Path(args.plot or EDGES_PLOT),
        has_plot=lambda report: bool(report.levels),
        note_failure=True,
    )


SUBCOMMAND = Token2WavServeSubcommand()


def stem_for(argv: Sequence[str]) -> str:
    """`token2wav_serve[_full][_talker<T>][_<N>threads][_cpuclock]`: the default command keeps the plain name.

    `--engine`: `token2wav_serve_engine[_poisson<R>][_wallclock]` (`_wallclock`: in-process steps by the wall clock);
    `--engine --soak`: `token2wav_serve_soak`.
    """
    if "--soak" in argv:
        return soak_stem(argv)
    if "--edge" in argv:
        return edges_stem(argv)
    if "--engine" in argv:
        rate = bench_cli.option_value(argv, "--request-rate")
        wall = "_wallclock" if bench_cli.option_value(argv, "--clock") == "wall" else ""
        return "token2wav_serve_engine" + ("" if rate is None else f"_poisson{float(rate):g}") + wall
    stem = "token2wav_serve_full" if "--full" in argv else "token2wav_serve"
    talker = bench_cli.option_value(argv, "--talker-rate")
    if talker is not None and float(talker) != 100.0:
        stem += f"_talker{float(talker):g}"
    return stem + bench_cli.thread_clock_suffix(argv)


def edges_stem(argv: Sequence[str]) -> str:
    """`token2wav_serve_edges[_smoke]`: `--engine --edge` (the plain name for the full comparison)."""
    return "token2wav_serve_edges" + ("_smoke" if "--smoke" in argv else "")


def soak_stem(argv: Sequence[str]) -> str:
    """`token2wav_serve_soak[_mns<N>]`: `_mns<N>` where `--max-num-seqs` overrides the shipped deployment's."""
    seqs = bench_cli.option_value(argv, "--max-num-seqs")
    return "token2wav_serve_soak" + ("" if seqs is None else f"_mns{seqs}")


RECORDERS = (
    bench_cli.Recorder(
        name="token2wav_serve",
        command=("bench", "token2wav-serve"),
        stem=stem_for,
        summary="token2wav_serve[_full][_talker<T>][_<N>threads][_cpuclock]_<device>, "
        "--engine: token2wav_serve_engine[_poisson<R>][_wallclock]_<device>: the stage under load",
    ),
    # a soak whose verdict fails (exit code 1) is a finding: its table is kept too
    bench_cli.Recorder(
        name="token2wav_serve_soak",
        command=("bench", "token2wav-serve", "--engine", "--soak"),
        stem=soak_stem,
        summary="token2wav_serve_soak[_mns<N>]_<device>: one server, 1,000 streamed requests at c=8 and a burst "
        "at c=64 (failures, RSS slope, TTFP per window)",
        recorded_codes=(0, 1),
    ),
    bench_cli.Recorder(
        name="token2wav_serve_edges",
        command=("bench", "token2wav-serve", "--engine", "--edge", "shm,mooncake"),
        stem=edges_stem,
        summary="token2wav_serve_edges[_smoke]_<device>: the code2wav edge on SharedMemory vs Mooncake TE (tcp "
        "loopback) at c=1,4,8: TTFP, throughput, per-chunk transfer time",
    ),
)
