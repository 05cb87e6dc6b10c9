# SPDX-License-Identifier: Apache-2.0
"""What the `vllm-omni bench` micro-benchmarks (spk-embedding, token2wav) do the same way, written once.

Their reports are read side by side (same host, same thread count, same file layout), so the parts
that are not about what they measure must not drift apart: how a run describes its host (CPU model,
usable cores, load average, the device a `--device` spec means), how the CLIs check the options
they share (`--device`, counts, `--threads` default, `--json` / `--plot` paths), how the report
files are written (JSON with non-finite numbers as null, PNG from an Agg canvas, both atomically),
and how a recorder script under `benchmarks/` runs the command and keeps its table next to its
JSON and PNG.

Cheap to import (the CLI modules import it at `vllm-omni --help` time): the platforms, torch and
matplotlib are imported inside the functions that use them.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import platform as py_platform
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from vllm_omni.atomic_io import write_bytes_atomic
from vllm_omni.entrypoints.cli.types import CLIUsageError

if TYPE_CHECKING:
    import torch
    from matplotlib.figure import Figure

MAX_DEFAULT_THREADS: Final = 8


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask), not the machine's count."""
    # Imported here: the platform package imports torch, which `--help` must not pay for.
    from vllm_omni.platforms.cpu.threads import usable_cores as cores

    return cores()


def default_threads() -> int:
    """The `--threads` default: the usable cores, at most `MAX_DEFAULT_THREADS`."""
    return max(1, min(usable_cores(), MAX_DEFAULT_THREADS))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return py_platform.processor() or py_platform.machine()


def load_average() -> tuple[float, float, float] | None:
    """The 1, 5 and 15 minute load averages (2 decimals), or None where the OS has none."""
    try:
        one, five, fifteen = os.getloadavg()
    except (OSError, AttributeError):  # not available on every OS
        return None
    return (round(one, 2), round(five, 2), round(fifteen, 2))


def resolve_device(spec: str) -> torch.device:
    """`"auto"` -> the serving platform's device; otherwise the spec, which must be on this host's platform."""
    from vllm_omni import platforms

    platform = platforms.current_omni_platform
    if spec == "auto":
        return platform.torch_device()
    device = platforms.normalize_device(spec)
    if device.type == "cpu":
        return device
    if device.type != platform.device_type:
        raise ValueError(f"device {spec!r} requested, but this host serves on {platform.device_type}")
    count = platform.device_count()
    if device.index is not None and device.index >= count:
        raise ValueError(f"device {spec!r} requested, but this host has {count} {device.type} device(s)")
    return device


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


class ReportWriter(Protocol):
    """A benchmark's rendering module (`<benchmark>_report`): the table it prints and the files it writes."""

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
    print(f"wrote {' and '.join(written)}", flush=True)
    if interrupted:
        print("vllm-omni: interrupted; the report above and the JSON are partial", file=sys.stderr)
        return 130
    return code


def fmt(value: float | None, spec: str, missing: str = "-") -> str:
    """`value` formatted by `spec`, or `missing` for a value that was not measured or is not finite."""
    return missing if value is None or not math.isfinite(value) else format(value, spec)


def finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by None, recursively (JSON has no NaN/Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def json_text(document: dict[str, Any]) -> str:
    """The report document as indented JSON; a non-finite measurement is written as null."""
    return json.dumps(finite(document), indent=2, allow_nan=False) + "\n"


def write_json(document: dict[str, Any], path: Path) -> None:
    write_bytes_atomic(path, json_text(document).encode())


def agg_figure(width: float, height: float) -> Figure:
    """A matplotlib figure on its own Agg canvas (no pyplot, no global backend switch)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Figure, title: str) -> bytes:
    """`fig` with its title, laid out, as PNG bytes."""
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


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


def argv_device_type(argv: Sequence[str]) -> str:
    """`cpu`, `cuda` or `npu`: the `--device` of `argv` (last one wins), or the serving platform's for auto."""
    from vllm_omni import platforms

    device = platforms.current_omni_platform.device_type
    for i, arg in enumerate(argv):
        if arg == "--device" and i + 1 < len(argv) and argv[i + 1] != "auto":
            device = argv[i + 1].split(":")[0]
        elif arg.startswith("--device=") and arg.split("=", 1)[1] != "auto":
            device = arg.split("=", 1)[1].split(":")[0]
    return device


def record_cli_run(command: Sequence[str], stem: Path, *, recorded_codes: Sequence[int] = (0,)) -> int:
    """Run `vllm-omni <command> --json <stem>.json --plot <stem>.png` in this process, echoing its output.

    When the exit code is one of `recorded_codes`, the printed output (the table) is kept as `<stem>.txt`
    as well, so the three files of a record always come from one run. Returns the command's exit code.
    """
    from vllm_omni.entrypoints.cli.main import main as cli_main

    args = [*command, "--json", f"{stem}.json", "--plot", f"{stem}.png"]
    tee = _Tee(sys.stdout)  # type: ignore[arg-type]
    with contextlib.redirect_stdout(tee):
        code = cli_main(args)
    if code in recorded_codes:
        write_bytes_atomic(Path(f"{stem}.txt"), tee.copy.getvalue().encode())
        print(f"recorded {stem}.txt")
    return code


__all__ = [
    "MAX_DEFAULT_THREADS",
    "ReportWriter",
    "add_device_option",
    "add_report_file_options",
    "add_threads_option",
    "agg_figure",
    "argv_device_type",
    "check_at_least",
    "check_device",
    "check_output_files",
    "cpu_model",
    "default_threads",
    "finite",
    "fmt",
    "json_text",
    "load_average",
    "png_bytes",
    "publish_report",
    "record_cli_run",
    "resolve_device",
    "run_benchmark",
    "usable_cores",
    "write_json",
]
