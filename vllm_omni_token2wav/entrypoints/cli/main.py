# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav` console script: `--version`, `--help`, `token2wav` (synthesis) and the `bench` group.

User mistakes (bad options, missing files) exit with code 2 and one `vllm-omni-token2wav: error: ...` line on
stderr, never a traceback; an unknown option is reported with the usage of the (sub)command it was
given to. Ctrl-C exits with 130 after the subcommand printed what it had.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from vllm_omni_token2wav.cli_types import CLISubcommand, CLIUsageError
from vllm_omni_token2wav.entrypoints.cli import serve as serve_cli
from vllm_omni_token2wav.entrypoints.cli.bench import load_bench_subcommands
from vllm_omni_token2wav.entrypoints.cli.token2wav import SUBCOMMAND as TOKEN2WAV
from vllm_omni_token2wav.logger import LOGGING_LEVEL_ENV
from vllm_omni_token2wav.version import __version__

PROG = "vllm-omni-token2wav"


EPILOG = f"""\
environment:
  {LOGGING_LEVEL_ENV}  log level of the vllm_omni_token2wav loggers: DEBUG, INFO (default), WARNING, ERROR
  VLLM_OMNI_TOKEN2WAV_PLATFORM       force the serving platform: auto (default), cpu, cuda, npu
  VLLM_OMNI_TOKEN2WAV_CACHE_DIR      generated stand-in assets and TensorRT engines
  (all variables: vllm_omni_token2wav/envs.py)
"""


def _tag_parsers(parser: argparse.ArgumentParser) -> None:
    """Record on every (sub)parser that it parsed the line, so errors show the deepest one's usage."""
    parser.set_defaults(_parser=parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _tag_parsers(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="vLLM-Omni Token2Wav stage tools: synthesis, benchmarks, quality gates.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    bench = commands.add_parser("bench", help="benchmarks and quality gates", description="Run a benchmark.")
    bench_commands = bench.add_subparsers(dest="bench_command", metavar="BENCHMARK")
    for sub in load_bench_subcommands():
        sub_parser = bench_commands.add_parser(sub.name, help=sub.help, description=sub.help)
        sub.add_cli_args(sub_parser)
        sub_parser.set_defaults(_run=sub.run)
    # `serve` hands its whole argument list to vLLM-Omni (`main` intercepts it before parsing).
    commands.add_parser(serve_cli.NAME, help=serve_cli.HELP, description=serve_cli.__doc__.split("\n\n")[1])
    synth = commands.add_parser(TOKEN2WAV.name, help=TOKEN2WAV.help, description=TOKEN2WAV.help)
    TOKEN2WAV.add_cli_args(synth)
    synth.set_defaults(_run=TOKEN2WAV.run)
    _tag_parsers(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == [serve_cli.NAME]:
        return serve_cli.serve(args_list[1:], PROG)
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        args._parser.error(f"unrecognized arguments: {' '.join(unknown)}")  # the subcommand's usage, exit 2
    run = getattr(args, "_run", None)
    if run is None:
        args._parser.print_help(sys.stderr)
        return 2
    return _execute(run, args, PROG)


def _execute(run: Callable[[argparse.Namespace], int], args: argparse.Namespace, prog: str) -> int:
    """`run(args)` with the CLI's exit codes: a `CLIUsageError` is one `<prog>: error: ...` line and 2, Ctrl-C 130."""
    try:
        return int(run(args))
    except CLIUsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def run_standalone(subcommand: CLISubcommand, argv: Sequence[str], prog: str) -> int:
    """One subcommand as a program of its own (`prog`), with the same options, errors and exit codes as `bench`.

    The developer benchmarks of the repository checkout (`python -m benchmarks.<name>`) run through it: they
    are not `bench` subcommands of the installed package, but behave like one.
    """
    parser = argparse.ArgumentParser(prog=prog, description=subcommand.help)
    subcommand.add_cli_args(parser)
    return _execute(subcommand.run, parser.parse_args(list(argv)), prog)


if __name__ == "__main__":
    sys.exit(main())
