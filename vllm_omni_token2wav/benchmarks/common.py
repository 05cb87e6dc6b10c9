# SPDX-License-Identifier: Apache-2.0
"""What the `vllm-omni-token2wav bench` benchmarks measure and write the same way, written once.

Their reports are read side by side (same host, same thread count, same file layout), so the parts
that are not about what they measure must not drift apart: how a run describes its host (CPU model,
usable cores, load average, the device a `--device` spec means), how it times a call on an
asynchronous device, and how the report files are written (JSON with non-finite numbers as null, PNG
from an Agg canvas, both atomically). The CLI side (options, publishing, recording) is `bench_cli`.

Cheap to import (the CLI modules import it at `vllm-omni-token2wav --help` time): the platforms, torch and
matplotlib are imported inside the functions that use them.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import platform as py_platform
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from vllm_omni_token2wav.atomic_io import write_bytes_atomic

if TYPE_CHECKING:
    import torch
    from matplotlib.figure import Figure

MAX_DEFAULT_THREADS: Final = 8
_T = TypeVar("_T")


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


def campplus_label(model_dir: Path) -> str:
    """What the folder's campplus.onnx is (`known_files`): official, stand-in, unknown file, or missing."""
    from vllm_omni_token2wav.known_files import identify_file

    onnx = model_dir / "campplus.onnx"
    return identify_file(onnx).label if onnx.is_file() else "missing"


def token2wav_model_dir(
    model_dir: Path | None, *, reduced: bool, seed: int, stage: Callable[[str], None], error: type[Exception]
) -> tuple[Path, dict[str, Any]]:
    """(token2wav folder, its description for a report): `model_dir`, or the stand-in generated on first use."""
    if model_dir is not None:
        path = Path(model_dir).expanduser()
        if not path.is_dir():
            raise error(f"--model-dir {path}: not a directory")
        return path, {"kind": "model-dir", "path": str(path), "campplus": campplus_label(path)}
    from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import ensure_standin_token2wav_dir

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


def publish_json_and_text(document: dict[str, Any], text: str, path: Path) -> None:
    """Print a developer benchmark's table, then write the document to `path` and the table beside it (`.txt`),
    both atomically (the recorded pair `benchmarks/results/<name>_cpu.{json,txt}`)."""
    print(text, end="")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(document, path)
    write_bytes_atomic(path.with_suffix(".txt"), text.encode())
    print(f"wrote {path} and {path.with_suffix('.txt')}")


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


__all__ = [
    "MAX_DEFAULT_THREADS",
    "agg_figure",
    "cpu_model",
    "default_threads",
    "environment_line",
    "finite",
    "fmt",
    "json_text",
    "load_average",
    "png_bytes",
    "publish_json_and_text",
    "resolve_device",
    "run_environment",
    "stamp_load_at_end",
    "synced_seconds",
    "timed_ms",
    "token2wav_model_dir",
    "torch_threads",
    "usable_cores",
    "write_json",
]
