# SPDX-License-Identifier: Apache-2.0
"""What the `vllm-omni-token2wav bench` micro-benchmarks (spk-embedding, token2wav) do the same way, written once.

Their reports are read side by side (same host, same thread count, same file layout), so the parts
that are not about what they measure must not drift apart: how a run describes its host (CPU model,
usable cores, load average, the device a `--device` spec means), how the CLIs check the options
they share (`--device`, counts, `--threads` default, `--json` / `--plot` paths), how the report
files are written (JSON with non-finite numbers as null, PNG from an Agg canvas, both atomically),
and how a recorder script under `benchmarks/` runs the command and keeps its table next to its
JSON and PNG.

Cheap to import (the CLI modules import it at `vllm-omni-token2wav --help` time): the platforms, torch and
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
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from vllm_omni_token2wav.atomic_io import write_bytes_atomic
from vllm_omni_token2wav.entrypoints.cli.types import CLIUsageError

if TYPE_CHECKING:
    import torch
    from matplotlib.figure import Figure

MAX_DEFAULT_THREADS: Final = 8
_T = TypeVar("_T")
# Where reports go unless an output path is given: one folder, ignored by git (.gitignore: /out/).
DEFAULT_REPORT_DIR: Final = Path("out")


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask), not the machine's count."""
    # Imported here: the platform package imports torch, which `--help` must not pay for.
    from vllm_omni_token2wav.platforms.cpu.threads import usable_cores as cores

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


def synced_seconds(sync: Callable[[], None], fn: Callable[..., _T], *args: Any, **kwargs: Any) -> tuple[_T, float]:
    """`fn(*args, **kwargs)` and its wall seconds; the platform is synchronised before the clock starts and
    before it stops, so work the call queued on an asynchronous device is billed to it."""
    sync()
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    sync()
    return out, time.perf_counter() - start


@contextlib.contextmanager
def stamp_load_at_end(environment: Callable[[], dict[str, Any]]) -> Iterator[None]:
    """On leaving the block (Ctrl-C too), record `loadavg_end` in the run's environment, if one was measured."""
    try:
        yield
    finally:
        env = environment()
        if env:
            env["loadavg_end"] = load_average()


def invoked_command() -> str:
    """The command line this process was started with, as a user would type it (for the report header)."""
    program = Path(sys.argv[0]).name
    return " ".join(["python -m vllm_omni_token2wav" if program == "__main__.py" else program, *sys.argv[1:]])


def stage_printer(name: str) -> Callable[[str], None]:
    """A benchmark's `stage` callback: `[name] text ...` on stderr (the table stays alone on stdout)."""
    return lambda text: print(f"[{name}] {text} ...", file=sys.stderr)


def run_environment(device: torch.device, threads: int) -> dict[str, Any]:
    """What a report says about the run's host: versions, CPU, device, threads, load average, time (UTC)."""
    from datetime import datetime, timezone

    import torch

    from vllm_omni_token2wav import platforms
    from vllm_omni_token2wav.version import __version__

    try:
        import onnxruntime

        ort_version: str | None = onnxruntime.__version__
    except ImportError:
        ort_version = None
    platform = platforms.current_omni_platform
    cpu = cpu_model()
    return {
        "python": py_platform.python_version(),
        "os": f"{py_platform.system()} {py_platform.release()}",
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "usable_cores": usable_cores(),
        "torch": torch.__version__,
        "onnxruntime": ort_version,
        "platform": platform.device_type,
        "device": str(device),
        "device_name": platform.get_device_name(device.index) if device.type != "cpu" else cpu,
        "threads": threads,
        "loadavg_start": load_average(),
        "loadavg_end": None,
        "timestamp_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "vllm_omni_token2wav": __version__,
    }


def token2wav_model_dir(
    model_dir: Path | None, *, reduced: bool, seed: int, stage: Callable[[str], None], error: type[Exception]
) -> tuple[Path, dict[str, Any]]:
    """(token2wav folder, its description for a report): `model_dir`, or the stand-in generated on first use."""
    if model_dir is not None:
        path = Path(model_dir).expanduser()
        if not path.is_dir():
            raise error(f"--model-dir {path}: not a directory")
        return path, {"kind": "model-dir", "path": str(path)}
    from vllm_omni_token2wav.model_executor.models.step_audio2.standin import ensure_standin_token2wav_dir

    size = "reduced" if reduced else "full"
    stage(f"stand-in token2wav directory ({size} size; the first full-size use writes ~1.2 GB, minutes)")
    start = time.perf_counter()
    path = ensure_standin_token2wav_dir(reduced=reduced, seed=seed)
    return path, {
        "kind": f"stand-in ({size} size)",
        "path": str(path),
        "seed": seed,
        "ensure_s": time.perf_counter() - start,
        "note": "seeded random weights: costs are real, the audio is noise",
    }


def resolve_device(spec: str) -> torch.device:
    """`"auto"` -> the serving platform's device; otherwise the spec, which must be on this host's platform."""
    from vllm_omni_token2wav import platforms

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


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to `threads` inside the block, restored afterwards."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def timed_ms(fn: Callable[[], Any], sync: Callable[[], None]) -> float:
    """Wall milliseconds of `fn()`, the device synchronised before the clock starts and before it stops
    (asynchronous device work is billed to the call that queued it)."""
    return synced_seconds(sync, fn)[1] * 1e3


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
    print(f"wrote {' and '.join(written)} (in {json_path.resolve().parent})", flush=True)
    if interrupted:
        print("vllm-omni-token2wav: interrupted; the report above and the JSON are partial", file=sys.stderr)
        return 130
    return code


def environment_line(env: dict[str, Any]) -> str:
    """The report header's host line: device, threads, torch, usable cores, load average start -> end, time."""
    load = env.get("loadavg_start"), env.get("loadavg_end")
    load_text = " -> ".join(f"{v[0]:.2f}" for v in load if v) or "n/a"
    return (
        f"device {env['device']} ({env['device_name']}), threads {env['threads']}, torch {env['torch']}, "
        f"usable cores {env['usable_cores']}, loadavg (1 min) {load_text}, {env['timestamp_utc']}"
    )


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


def record_cli_run(command: Sequence[str], stem: Path, *, recorded_codes: Sequence[int] = (0,)) -> int:
    """Run `vllm-omni-token2wav <command> --json <stem>.json --plot <stem>.png` in this process, echoing its output.

    When the exit code is one of `recorded_codes`, the printed output (the table) is kept as `<stem>.txt`
    as well, so the three files of a record always come from one run. Returns the command's exit code.
    """
    from vllm_omni_token2wav.entrypoints.cli.main import main as cli_main

    args = [*command, "--json", f"{stem}.json", "--plot", f"{stem}.png"]
    tee = _Tee(sys.stdout)  # type: ignore[arg-type]
    with contextlib.redirect_stdout(tee):
        code = cli_main(args)
    if code in recorded_codes:
        write_bytes_atomic(Path(f"{stem}.txt"), tee.copy.getvalue().encode())
        print(f"recorded {stem}.txt")
    return code


def record_main(argv: Sequence[str], *, script: str, bench: str, stem: str, results: Path) -> int:
    """A recorder script's main: `vllm-omni-token2wav bench <bench> <argv>` kept as `<results>/<stem>_<device>.*`.

    The files are `<stem>_<device>.txt`, `.json` and `.png`.

    `--results-dir DIR` in `argv` records elsewhere (tests); `<device>` is cpu, cuda or npu (from
    `--device`). Returns the command's exit code (2 for a `--results-dir` without a folder).
    """
    args = list(argv)
    if "--results-dir" in args:
        i = args.index("--results-dir")
        if i + 1 >= len(args):
            print(f"{script}: --results-dir needs a folder", file=sys.stderr)
            return 2
        results, args = Path(args[i + 1]), args[:i] + args[i + 2 :]
    return record_cli_run(["bench", bench, *args], results / f"{stem}_{argv_device_type(args)}", recorded_codes=(0,))


__all__ = [
    "DEFAULT_REPORT_DIR",
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
    "environment_line",
    "finite",
    "fmt",
    "invoked_command",
    "json_text",
    "load_average",
    "option_value",
    "png_bytes",
    "publish_report",
    "record_cli_run",
    "record_main",
    "resolve_device",
    "run_benchmark",
    "run_environment",
    "stage_printer",
    "stamp_load_at_end",
    "synced_seconds",
    "timed_ms",
    "token2wav_model_dir",
    "thread_clock_suffix",
    "torch_threads",
    "usable_cores",
    "write_json",
]
