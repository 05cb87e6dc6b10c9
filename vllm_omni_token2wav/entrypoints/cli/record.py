# SPDX-License-Identifier: Apache-2.0
"""`benchmarks/record.py NAME [options]`: run one `bench` subcommand in-process and keep its table, JSON and PNG.

A recorded number must come from the command an operator runs. Each benchmark home declares how its runs
are named (`bench_cli.Recorder` in its `cli.py`); this module runs the command through the CLI's own `main`
and keeps the printed table next to the JSON and PNG the command writes. It lives with the CLI, above the
benchmarks, because it calls `main` (a benchmark module calling back into the CLI would be an import loop).
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from vllm_omni_token2wav.atomic_io import write_bytes_atomic
from vllm_omni_token2wav.benchmarks.bench_cli import Recorder
from vllm_omni_token2wav.entrypoints.cli.bench import load_recorders


class _Tee(io.TextIOBase):
    """Write to the terminal and keep a copy (the .txt record of the table)."""

    def __init__(self, stream: io.TextIOBase) -> None:
        self._stream = stream
        self.copy = io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()


def record_cli_run(
    command: Sequence[str],
    stem: Path,
    *,
    recorded_codes: Sequence[int] = (0,),
    entry: Callable[[Sequence[str]], int] | None = None,
) -> int:
    """Run `vllm-omni-token2wav <command> --json <stem>.json --plot <stem>.png` in this process, echoing its output.

    `entry` runs the command line instead of the CLI's `main` (a developer benchmark's own runner). When the
    exit code is one of `recorded_codes`, the printed output (the table) is kept as `<stem>.txt` as well, so
    the three files of a record always come from one run. Returns the command's exit code.
    """
    from vllm_omni_token2wav.entrypoints.cli import main as cli

    args = [*command, "--json", f"{stem}.json", "--plot", f"{stem}.png"]
    tee = _Tee(sys.stdout)  # type: ignore[arg-type]
    with contextlib.redirect_stdout(tee):
        code = (entry or cli.main)(args)
    if code in recorded_codes:
        write_bytes_atomic(Path(f"{stem}.txt"), tee.copy.getvalue().encode())
        print(f"recorded {stem}.txt")
    return code


def record(recorder: Recorder, argv: Sequence[str], results: Path) -> int:
    """Run `recorder`'s command with `argv` and keep its files; the command's exit code (2: bad options)."""
    try:
        command, stem = recorder.plan(argv, results)
    except ValueError as exc:
        print(f"record.py {recorder.name}: {exc}", file=sys.stderr)
        return 2
    return record_cli_run(command, stem, recorded_codes=recorder.recorded_codes, entry=recorder.entry)


def record_main(argv: Sequence[str], results: Path, recorders: Mapping[str, Recorder] | None = None) -> int:
    """`benchmarks/record.py`: `NAME [options]` records one run, `--list` shows the names.

    `recorders` defaults to the package's; the checkout's `record.py` adds its developer benchmarks' ones.
    """
    recorders = load_recorders() if recorders is None else recorders
    args = list(argv)
    if not args or args[0] in ("-h", "--help", "--list"):
        out = sys.stdout if args else sys.stderr
        if not args or args[0] != "--list":
            print("usage: record.py NAME [options of its command] [--results-dir DIR]", file=out)
        width = max(len(name) for name in recorders)
        for listed, entry in recorders.items():
            line = " ".join([entry.program, *entry.command])
            print(f"{listed:<{width}}  {line}: {entry.summary}", file=out)
        return 0 if args else 2
    name, rest = args[0], args[1:]
    recorder = recorders.get(name)
    if recorder is None:
        print(f"record.py: unknown benchmark {name!r}; one of: {', '.join(recorders)}", file=sys.stderr)
        return 2
    return record(recorder, rest, results)


__all__ = ["record", "record_cli_run", "record_main"]
