# SPDX-License-Identifier: Apache-2.0
"""The prompt-path and graph sections of the device check (the Token2Wav stage is `device_check.token2wav`).

- `prompt_path`: `StepAudio2Token2WavCore.prepare_prompt` end to end (resample to 16 / 24 kHz, fbank,
  CAM++, 24 kHz prompt mel) per speaker path (onnxruntime CPU fallback, torch eager, torch graph,
  TensorRT when present), prompt cache off, the platform synchronised around every call; plus the
  flow model's whole prompt (`with_tokens=True`: the speech tokenizer too) on the graph path over
  the token2wav stand-in.
- `graphs`: the counters of every capture helper of the process and the device allocator's bytes.

Resampling: the audio front end resamples with python-soxr, which accelerator images may lack (the
check installs nothing). Then these sections run with a stand-in `soxr` module for their duration,
backed by `scipy.signal.resample_poly` (polyphase FIR, Kaiser window), and say so in the report;
without scipy either, they are skipped with that reason.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from vllm_omni_token2wav.benchmarks.common import timed_ms
from vllm_omni_token2wav.benchmarks.device_check.campplus import (
    SAMPLE_RATE,
    campplus_backends,
    latency_row,
    speech_waveform,
)
from vllm_omni_token2wav.benchmarks.device_check.sections import SectionSkip

if TYPE_CHECKING:
    from vllm_omni_token2wav.benchmarks.device_check.sections import SectionContext

PROMPT_SECONDS: Final = (3.0, 10.0)
SMOKE_PROMPT_SECONDS: Final = (1.0,)
PROMPT_CALLS: Final = 15
SMOKE_PROMPT_CALLS: Final = 2


@contextlib.contextmanager
def resampler() -> Iterator[str]:
    """python-soxr when installed, else a stand-in `soxr` module over scipy for this block; yields which."""
    try:
        import soxr  # noqa: F401
    except ImportError:
        pass
    else:
        yield "python-soxr"
        return
    try:
        from scipy import signal
    except ImportError:
        raise SectionSkip(
            "prompt audio resampling needs python-soxr, or scipy for the device check's stand-in; neither is installed"
        ) from None

    def resample(x: np.ndarray, in_rate: float, out_rate: float, quality: str = "HQ") -> np.ndarray:
        up, down = int(out_rate), int(in_rate)
        g = math.gcd(up, down)
        return np.asarray(signal.resample_poly(np.asarray(x, dtype=np.float64), up // g, down // g))

    module = types.ModuleType("soxr")
    module.__doc__ = "device-check stand-in for python-soxr: scipy.signal.resample_poly"
    module.resample = resample  # type: ignore[attr-defined]
    had, previous = "soxr" in sys.modules, sys.modules.get("soxr")  # a failed import may leave an entry
    sys.modules["soxr"] = module
    try:
        yield "scipy.signal.resample_poly (stand-in: python-soxr is not installed)"
    finally:
        if had:
            sys.modules["soxr"] = previous  # type: ignore[assignment]
        else:
            sys.modules.pop("soxr", None)


def _campplus_dir(onnx: Path) -> Path:
    """A folder holding `campplus.onnx` (a link to `onnx`): all `prepare_prompt` without tokens reads."""
    folder = Path(tempfile.mkdtemp(prefix="device_check_prompt_"))
    target = folder / "campplus.onnx"
    try:
        os.symlink(onnx.resolve(), target)
    except OSError:  # file systems without symlinks
        import shutil

        shutil.copyfile(onnx, target)
    return folder


# ---------------------------------------------------------------------------------------------
# prompt_path
# ---------------------------------------------------------------------------------------------


def run_prompt_path(ctx: SectionContext) -> None:
    from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav import StepAudio2Token2WavCore

    backends = campplus_backends(ctx)
    folder = _campplus_dir(ctx.shared["campplus_onnx"])
    cores: dict[str, tuple[Any, bool]] = {}  # name -> (core, with_tokens)
    for name in ("onnxruntime-cpu-1t", "torch-eager", "torch-graph", "tensorrt"):
        if name not in backends:
            continue
        core = StepAudio2Token2WavCore(folder, device=ctx.device, prompt_cache_size=0, ort_intra_op_threads=1)
        if name != "onnxruntime-cpu-1t":  # the facade's default speaker path is the ORT fallback
            core.install_spk_backend(backends[name])
        cores[name] = (core, False)
    stage_dir = ctx.shared.get("token2wav_dir")
    if stage_dir is not None and "torch-graph" in backends:  # the flow's whole prompt: speech tokens too
        core = StepAudio2Token2WavCore(stage_dir, device=ctx.device, prompt_cache_size=0, ort_intra_op_threads=1)
        core.install_spk_backend(backends["torch-graph"])
        cores["torch-graph+tokens"] = (core, True)
    calls = SMOKE_PROMPT_CALLS if ctx.smoke else PROMPT_CALLS
    rows: list[dict[str, Any]] = ctx.result.setdefault("rows", [])
    with resampler() as which:
        ctx.result["resampler"] = which
        for seconds in SMOKE_PROMPT_SECONDS if ctx.smoke else PROMPT_SECONDS:
            if ctx.out_of_time(reserve_s=1.0):
                ctx.note(f"out of time before the {seconds:g} s prompt")
                break
            prompt = (speech_waveform(int(seconds * SAMPLE_RATE)), SAMPLE_RATE)
            for core, tokens in cores.values():  # first call: sessions, constants, the graph of this shape
                core.prepare_prompt(prompt, with_tokens=tokens)
            times: dict[str, list[float]] = {name: [] for name in cores}
            for _ in range(calls):
                for name, (core, tokens) in cores.items():
                    call = functools.partial(core.prepare_prompt, prompt, with_tokens=tokens)
                    times[name].append(timed_ms(call, ctx.sync))
                if ctx.out_of_time(reserve_s=0.5):
                    ctx.note(f"{seconds:g} s prompt: stopped after {len(times[name])} rounds")
                    break
            ort_p50 = latency_row(times["onnxruntime-cpu-1t"])["p50_ms"]
            for name, values in times.items():
                row = {"seconds": seconds, "backend": name, **latency_row(values)}
                row["ort_p50_over_this"] = ort_p50 / row["p50_ms"]
                rows.append(row)
            ctx.flush()


def render_prompt_path(result: dict[str, Any]) -> list[str]:
    lines = [
        f"resampler: {result.get('resampler')}",
        f"{'prompt':>6} {'speaker path':<20} {'n':>3} {'p50 ms':>9} {'p99 ms':>9} {'ORT/this':>9}",
    ]
    for r in result.get("rows", []):
        lines.append(
            f"{r['seconds']:>5g}s {r['backend']:<20} {r['n']:>3} {r['p50_ms']:>9.2f} {r['p99_ms']:>9.2f} "
            f"{r['ort_p50_over_this']:>8.1f}x"
        )
    return lines


# ---------------------------------------------------------------------------------------------
# graphs
# ---------------------------------------------------------------------------------------------


def run_graphs(ctx: SectionContext) -> None:
    from vllm_omni_token2wav.platforms.device_graphs import all_graph_counters

    ctx.result["runners"] = [c.as_dict() for c in all_graph_counters()]
    api = ctx.platform.device_graph_api() if ctx.device.type != "cpu" else None
    ctx.result["platform_graph_api"] = None if api is None else api.name
    ctx.result["memory"] = ctx.platform.memory_stats(ctx.device) if ctx.device.type != "cpu" else None


def render_graphs(result: dict[str, Any]) -> list[str]:
    lines = [f"platform graph API: {result.get('platform_graph_api')}"]
    for c in result.get("runners", []):
        state = c["backend"] if c["disabled_reason"] is None else f"eager ({c['disabled_reason']})"
        lines.append(
            f"{c['name']}: {state}, {c['graphs']}/{c['max_graphs']} graphs, {c['captures']} captures "
            f"({c['capture_ms']:.0f} ms), {c['replays']} replays, {c['eager_fallbacks']} eager fallbacks, "
            f"{c['evictions']} evictions, {c['failures']} failures"
        )
    memory = result.get("memory")
    if memory:
        lines.append(
            "device memory: " + ", ".join(f"{k.removesuffix('_bytes')} {v / 2**20:.0f} MiB" for k, v in memory.items())
        )
    return lines


__all__ = [
    "render_graphs",
    "render_prompt_path",
    "resampler",
    "run_graphs",
    "run_prompt_path",
]
