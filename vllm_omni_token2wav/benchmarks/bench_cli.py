# SPDX-License-Identifier: Apache-2.0
"""The skeleton every benchmark home's `cli.py` shares: options, checks, the run body, publishing, recording a run.

A `bench` subcommand (and a developer benchmark of the checkout, `python -m benchmarks.<name>`) is argparse
plus a benchmark run; the parts that are not about what it measures are written once here so that the
subcommands cannot drift apart: the options they share (`--device`, `--threads`, `--json` / `--plot`: the
one spelling of a report file; a report folder is `--out-dir`) and their checks (one-line usage errors,
exit code 2), the `run` body (`run_and_publish`: stamp the command, run, interrupt, publish), how a report
is published (the table on stdout, the JSON always, the PNG when there is something to plot; 130 for
Ctrl-C), and how `benchmarks/record.py` keeps one run's three files under `benchmarks/results/` (a
`Recorder` per recorded benchmark, declared in its home's `cli.py`; running it is
`entrypoints/cli/record.py`, above the benchmarks, since it calls the CLI's `main`).

Cheap to import (every `cli.py` imports it at `vllm-omni-token2wav --help` time): the platforms, torch and
matplotlib are imported inside the functions that use them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from vllm_omni_token2wav.benchmarks.common import MAX_DEFAULT_THREADS
from vllm_omni_token2wav.cli_types import CLIUsageError

# Where reports go unless an output path is given: one folder, ignored by git (.gitignore: /out/).
DEFAULT_REPORT_DIR: Final = Path("out")


def invoked_command() -> str:
    """The command line this process was started with, as a user would type it (for the report header)."""
    path = Path(sys.argv[0])
    program = path.name
    if program == "__main__.py":  # `python -m vllm_omni_token2wav` or a developer home's `python -m benchmarks.<name>`
        home = path.parent.name
        program = "python -m vllm_omni_token2wav" if home == "vllm_omni_token2wav" else f"python -m benchmarks.{home}"
    return " ".join([program, *sys.argv[1:]])


def stage_printer(name: str) -> Callable[[str], None]:
    """A benchmark's `stage` callback: `[name] text ...` on stderr (the table stays alone on stdout)."""
    return lambda text: print(f"[{name}] {text} ...", file=sys.stderr)


def check_device(text: str) -> str:
    """The `--device` value, stripped, if it is auto, cpu, cuda[:i] or npu[:i] (the platform is checked later)."""
    text = text.strip()
    if text in ("auto", "cpu"):
        return text
    head, _, index = text.partition(":")
    if head not in ("cuda", "npu") or (index and not index.isdigit()):
        raise CLIUsageError(f"--device {text!r}: expected auto, cpu, cuda[:i] or npu[:i]")
    return text


def check_at_least(option: str, value: int | None, low: int) -> None:
    if value is not None and value < low:
        raise CLIUsageError(f"{option} must be >= {low}, got {value}")


def check_output_files(args: argparse.Namespace, options: Sequence[str] = ("json", "plot")) -> None:
    """Refuse an output option naming a folder before the run, not after minutes of measuring."""
    for option in options:
        value = getattr(args, option)
        if value is not None and Path(value).is_dir():
            raise CLIUsageError(f"--{option} {value}: is a folder; give a file name")


def add_device_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="auto (serving device), cpu, cuda[:i] or npu[:i]")


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help=f"torch threads and onnxruntime intra-op threads (default: usable cores, <= {MAX_DEFAULT_THREADS})",
    )


def add_report_file_options(parser: argparse.ArgumentParser, default_json: str, default_plot: str) -> None:
    parser.add_argument("--json", metavar="OUT", help=f"JSON report path (default ./{default_json})")
    parser.add_argument("--plot", metavar="OUT.png", help=f"PNG plot path (default ./{default_plot})")
    parser.epilog = (parser.epilog + "\n" if parser.epilog else "") + (
        f"Reports go to ./{DEFAULT_REPORT_DIR}/ (ignored by git) unless --json / --plot name other files."
    )


def add_unused_plot_option(parser: argparse.ArgumentParser) -> None:
    """`--plot OUT.png`, parsed and ignored: benchmarks/record.py passes it to every recorder, and a benchmark whose
    report is its table draws no figure."""
    parser.add_argument("--plot", metavar="OUT.png", help="accepted for benchmarks/record.py; nothing is drawn")


def add_json_option(parser: argparse.ArgumentParser, default: Path | None, *, deprecated: Sequence[str] = ()) -> None:
    """`--json OUT`: the one spelling of a report file across the subcommands (a folder is `--out-dir`).

    `deprecated`: spellings a benchmark used before (`--out`, `--output`); they still parse, into the same
    value, but `--help` no longer shows them.
    """
    shown = f"default ./{default}" if default is not None else "default: not written"
    parser.add_argument("--json", type=Path, default=default, metavar="OUT", help=f"JSON report path ({shown})")
    for old in deprecated:
        parser.add_argument(old, dest="json", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


class ReportWriter(Protocol):
    """A benchmark's rendering module (`<home>/report.py`): the table it prints and the files it writes."""

    def render_text(self, report: Any, /) -> str: ...

    def write_json(self, report: Any, path: Path, /) -> None: ...

    def write_plot(self, report: Any, path: Path, /) -> None: ...


def run_benchmark(run: Callable[[], object], setup_error: type[Exception]) -> bool:
    """Call `run()`; True when Ctrl-C interrupted it (the report keeps what was measured).

    A `setup_error` (an input of the run cannot be used; its message says which) becomes a `CLIUsageError`:
    one line and exit code 2, no traceback.
    """
    try:
        run()
    except setup_error as exc:
        raise CLIUsageError(str(exc)) from None
    except KeyboardInterrupt:
        return True
    return False


def publish_report(
    report: Any,
    writer: ReportWriter,
    json_path: Path,
    plot_path: Path,
    *,
    plot: bool,
    interrupted: bool,
    code: int = 0,
) -> int:
    """Print the table, write the JSON (always, a partial one too) and, when `plot`, the PNG.

    Returns the exit code: 130 for an interrupted run, else `code`.
    """
    sys.stdout.write(writer.render_text(report))
    writer.write_json(report, json_path)
    written = [str(json_path)]
    if plot:
        writer.write_plot(report, plot_path)
        written.append(str(plot_path))
    print(f"wrote {' and '.join(written)} (in {json_path.resolve().parent})", flush=True)
    if interrupted:
        print("vllm-omni-token2wav: interrupted; the report above and the JSON are partial", file=sys.stderr)
        return 130
    return code


class Benchmark(Protocol):
    """What `run_and_publish` drives: a benchmark object whose `run()` fills `report` as it goes."""

    report: Any

    def run(self) -> object: ...


def run_and_publish(
    bench: Benchmark,
    writer: ReportWriter,
    setup_error: type[Exception],
    args: argparse.Namespace,
    default_json: str | Path,
    default_plot: str | Path,
    *,
    plot: Callable[[Any], bool],
    failed: Callable[[Any], bool] = lambda report: False,
    after_run: Callable[[], None] | None = None,
) -> int:
    """The `run` body every benchmark subcommand shares, once: stamp the command line on the report, run the
    benchmark (`run_benchmark`), then `publish_report` to `--json` / `--plot` (or the defaults).

    `plot(report)`: whether there is something to draw; `failed(report)`: exit code 1 (a parity or serving
    failure the report shows); `after_run`: called when the run ends, however it ends (closing a progress bar
    before the table is printed). Returns the exit code (0, 1, 130 interrupted; a usage error raises).
    """
    if hasattr(bench.report, "command"):
        bench.report.command = invoked_command()
    try:
        interrupted = run_benchmark(bench.run, setup_error)
    finally:
        if after_run is not None:
            after_run()
    report = bench.report
    return publish_report(
        report,
        writer,
        Path(args.json or default_json),
        Path(args.plot or default_plot),
        plot=plot(report),
        interrupted=interrupted,
        code=1 if failed(report) else 0,
    )


def option_value(argv: Sequence[str], option: str) -> str | None:
    """The value of `option` in `argv` (`--opt V` or `--opt=V`, the last one wins), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(option + "="):
            value = arg.split("=", 1)[1]
    return value


def thread_clock_suffix(argv: Sequence[str]) -> str:
    """`_<N>threads` for a non-default `--threads`, `_cpuclock` for `--clock cpu`: a recorder's variant name."""
    suffix = ""
    threads = option_value(argv, "--threads")
    if threads not in (None, "1"):
        suffix += f"_{threads}threads"
    if option_value(argv, "--clock") == "cpu":
        suffix += "_cpuclock"
    return suffix


def argv_device_type(argv: Sequence[str]) -> str:
    """`cpu`, `cuda` or `npu`: the `--device` of `argv` (last one wins), or the serving platform's for auto."""
    from vllm_omni_token2wav import platforms

    device = platforms.current_omni_platform.device_type
    for i, arg in enumerate(argv):
        if arg == "--device" and i + 1 < len(argv) and argv[i + 1] != "auto":
            device = argv[i + 1].split(":")[0]
        elif arg.startswith("--device=") and arg.split("=", 1)[1] != "auto":
            device = arg.split("=", 1)[1].split(":")[0]
    return device


def _pop_option(argv: list[str], name: str, what: str) -> tuple[list[str], str | None]:
    """`argv` without `name VALUE`, and VALUE (None when absent); ValueError naming `what` when VALUE is missing."""
    if name not in argv:
        return argv, None
    i = argv.index(name)
    if i + 1 >= len(argv):
        raise ValueError(f"{name} needs {what}")
    return argv[:i] + argv[i + 2 :], argv[i + 1]


@dataclass(frozen=True)
class Recorder:
    """How `benchmarks/record.py NAME` names one run of a `bench` subcommand kept under `benchmarks/results/`.

    The files are `<stem>_<device>[_<tag>].txt`, `.json` and `.png`: `stem` names the variant from the
    user's options (`--full`, `--threads`, ...), `<device>` is cpu, cuda or npu (from `--device`), and
    `_<tag>` follows `--tag T` where `tag_option` is set. `--results-dir DIR` records elsewhere (tests).
    A developer benchmark of the checkout (`benchmarks/<name>/`) sets `program` and `entry` (its own runner),
    and `command` is empty.
    The table is kept only for an exit code in `recorded_codes`, so the three files come from one run.
    """

    name: str  # NAME on record.py's command line
    command: tuple[str, ...]  # the words after `program`, before the user's options, e.g. ("bench", "token2wav")
    stem: Callable[[Sequence[str]], str]  # variant name from the user's options, before `_<device>`
    summary: str  # one line for `record.py --list`
    recorded_codes: tuple[int, ...] = (0,)
    tag_option: bool = False
    #: how a user starts the command, for `record.py --list` (a developer benchmark: `python -m benchmarks.<name>`)
    program: str = "vllm-omni-token2wav"
    #: what runs the command line in-process; None: the package CLI's `main` (`command` starts with its words)
    entry: Callable[[Sequence[str]], int] | None = None

    def stem_for(self, argv: Sequence[str]) -> str:
        return self.stem(argv)

    def plan(self, argv: Sequence[str], results: Path) -> tuple[list[str], Path]:
        """(the command line to run, the files' stem) for `record.py NAME argv`; ValueError for a missing value."""
        args, results_dir = _pop_option(list(argv), "--results-dir", "a folder")
        tag = None
        if self.tag_option:
            args, tag = _pop_option(args, "--tag", "a value")
        folder = Path(results_dir) if results_dir else results
        stem = folder / (f"{self.stem(args)}_{argv_device_type(args)}" + (f"_{tag}" if tag else ""))
        return [*self.command, *args], stem


def fixed_stem(name: str) -> Callable[[Sequence[str]], str]:
    """A recorder's `stem` that ignores the options."""
    return lambda argv: name


def full_stem(name: str) -> Callable[[Sequence[str]], str]:
    """A recorder's `stem`: `<name>_full` with `--full`, else `<name>`."""
    return lambda argv: f"{name}_full" if "--full" in argv else name


__all__ = [
    "DEFAULT_REPORT_DIR",
    "Recorder",
    "Benchmark",
    "ReportWriter",
    "add_device_option",
    "add_json_option",
    "add_report_file_options",
    "add_threads_option",
    "argv_device_type",
    "check_at_least",
    "check_device",
    "check_output_files",
    "fixed_stem",
    "full_stem",
    "invoked_command",
    "option_value",
    "publish_report",
    "run_and_publish",
    "run_benchmark",
    "stage_printer",
    "thread_clock_suffix",
]
