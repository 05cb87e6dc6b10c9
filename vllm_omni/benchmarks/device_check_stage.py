# SPDX-License-Identifier: Apache-2.0
"""The stage sections of the device check: prompt path, Token2Wav at concurrency 1, graph counters.

- `prompt_path`: `StepAudio2Token2WavCore.prepare_prompt` end to end (resample to 16 / 24 kHz, fbank,
  CAM++, 24 kHz prompt mel) per speaker path (onnxruntime CPU fallback, torch eager, torch graph,
  TensorRT when present), prompt cache off, the platform synchronised around every call.
- `token2wav`: `vllm_omni.benchmarks.token2wav_rtf` (whole utterance and 25-token streaming RTF,
  first audio, component split, prompt preparation with speech tokens) on the full-size stand-in
  (reduced with `--smoke`), 10 s of tokens and 10 Euler steps on an accelerator. Concurrency 8 / 32,
  the batched stage and stage graphs on vs off are phase 2 (issue #15), added as further sections.
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

from vllm_omni.benchmarks.common import timed_ms
from vllm_omni.benchmarks.device_check import SectionSkip
from vllm_omni.benchmarks.device_check_campplus import SAMPLE_RATE, campplus_backends, latency_row, speech_waveform

if TYPE_CHECKING:
    from vllm_omni.benchmarks.device_check import SectionContext

PROMPT_SECONDS: Final = (3.0, 10.0)
SMOKE_PROMPT_SECONDS: Final = (1.0,)
PROMPT_CALLS: Final = 15
SMOKE_PROMPT_CALLS: Final = 2
#: token2wav sizes: (gen_seconds, prompt_seconds, n_timesteps, runs, warmup, prompt_calls)
TOKEN2WAV_SIZES: Final = (10.0, 3.0, 10, 3, 1, 5)
SMOKE_TOKEN2WAV_SIZES: Final = (0.6, 1.0, 2, 1, 0, 1)
GOAL_STREAM_RTF: Final = 0.05


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
    from vllm_omni.model_executor.models.step_audio2.step_audio2_token2wav import StepAudio2Token2WavCore

    backends = campplus_backends(ctx)
    folder = _campplus_dir(ctx.shared["campplus_onnx"])
    cores = {}
    for name in ("onnxruntime-cpu-1t", "torch-eager", "torch-graph", "tensorrt"):
        if name not in backends:
            continue
        core = StepAudio2Token2WavCore(folder, device=ctx.device, prompt_cache_size=0, ort_intra_op_threads=1)
        if name != "onnxruntime-cpu-1t":  # the facade's default speaker path is the ORT fallback
            core.install_spk_backend(backends[name])
        cores[name] = core
    calls = SMOKE_PROMPT_CALLS if ctx.smoke else PROMPT_CALLS
    rows: list[dict[str, Any]] = ctx.result.setdefault("rows", [])
    with resampler() as which:
        ctx.result["resampler"] = which
        for seconds in SMOKE_PROMPT_SECONDS if ctx.smoke else PROMPT_SECONDS:
            if ctx.out_of_time(reserve_s=1.0):
                ctx.note(f"out of time before the {seconds:g} s prompt")
                break
            prompt = (speech_waveform(int(seconds * SAMPLE_RATE)), SAMPLE_RATE)
            for core in cores.values():  # first call: sessions, constants, the graph of this shape
                core.prepare_prompt(prompt)
            times: dict[str, list[float]] = {name: [] for name in cores}
            for _ in range(calls):
                for name, core in cores.items():
                    times[name].append(timed_ms(functools.partial(core.prepare_prompt, prompt), ctx.sync))
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
# token2wav
# ---------------------------------------------------------------------------------------------


def _summary(document: dict[str, Any]) -> dict[str, Any]:
    modes = {}
    for mode in document.get("synthesis", []):
        modes[mode["mode"]] = {
            "audio_seconds": mode["audio_seconds"],
            "runs": len(mode["runs"]),
            "rtf": mode["rtf"],
            "rtf_after_setup": mode["rtf_after_setup"],
            "first_audio_s": mode["median_first_audio_s"],
            "setup_s": mode["median_setup_s"],
            "first_chunk_s": mode["median_first_chunk_s"],
            "split_of_median_run_s": mode["split_of_median_run_s"],
        }
    prompt = {
        c["case"]: {"backend": c["backend"], "median_ms": c["median_ms"], "calls": c["calls"]}
        for c in document.get("prompt_prep", [])
    }
    return {
        "modes": modes,
        "prompt_prep": prompt,
        "backends": document.get("backends"),
        "load_s": document.get("load_s"),
    }


def run_token2wav(ctx: SectionContext) -> None:
    from vllm_omni.benchmarks.token2wav_rtf import BenchConfig, Token2WavBenchmark

    gen_s, prompt_s, steps, runs, warmup, prompt_calls = SMOKE_TOKEN2WAV_SIZES if ctx.smoke else TOKEN2WAV_SIZES
    config = BenchConfig(
        model_dir=ctx.config.model_dir,
        reduced=ctx.smoke and ctx.config.model_dir is None,
        device=str(ctx.device),
        gen_seconds=gen_s,
        prompt_seconds=prompt_s,
        n_timesteps=steps,
        runs=runs,
        warmup=warmup,
        prompt_calls=prompt_calls,
        threads=ctx.config.threads,
        seed=ctx.config.seed,
        plan="device-check-smoke" if ctx.smoke else "device-check",
    )
    ctx.result["concurrency"] = 1
    ctx.result["stage_graphs"] = "off (stage capture is phase 2)"
    bench = Token2WavBenchmark(config, stage=ctx.log)
    bench.report.command = "vllm_omni.benchmarks.device_check (token2wav section)"
    try:
        with resampler() as which:
            ctx.result["resampler"] = which
            bench.run()
    finally:  # a timeout or an error keeps what the benchmark measured so far
        try:
            document = bench.report.to_dict()
        except Exception as exc:  # a half-filled report (e.g. a prompt case without calls)
            ctx.note(f"partial token2wav report could not be summarised: {type(exc).__name__}: {exc}")
        else:
            ctx.result["summary"] = _summary(document)
            ctx.result["report"] = document
        ctx.flush()
    stream = ctx.result.get("summary", {}).get("modes", {}).get("stream")
    if stream is not None:
        full_size = not config.reduced and config.n_timesteps == 10
        ctx.goal(
            "token2wav_stream_rtf_c1",
            stream["rtf"],
            f"<= {GOAL_STREAM_RTF} (full size, n_timesteps 10)",
            stream["rtf"] <= GOAL_STREAM_RTF if full_size and ctx.device.type != "cpu" else None,
            f"{'full' if not config.reduced else 'reduced'} stand-in, n_timesteps {config.n_timesteps}, "
            f"{config.gen_seconds:g} s of tokens, {ctx.device}, stage graphs off",
        )


def render_token2wav(result: dict[str, Any]) -> list[str]:
    summary = result.get("summary")
    if not summary:
        return ["no measurement"]
    lines = [f"resampler: {result.get('resampler')}; stage graphs: {result.get('stage_graphs')}"]
    lines.append(f"{'mode':<7} {'RTF':>7} {'RTF*':>7} {'1st audio':>10} {'setup':>8} {'1st chunk':>10}")
    for mode, m in summary["modes"].items():
        setup = "-" if m["setup_s"] is None else f"{m['setup_s']:.3f}s"
        first_chunk = "-" if m["first_chunk_s"] is None else f"{m['first_chunk_s']:.3f}s"
        lines.append(
            f"{mode:<7} {m['rtf']:>7.3f} {m['rtf_after_setup']:>7.3f} {m['first_audio_s']:>9.3f}s {setup:>8} "
            f"{first_chunk:>10}"
        )
    lines.append("RTF* = after the voice setup a known voice does not pay again")
    for case, p in summary["prompt_prep"].items():
        lines.append(f"prompt prep {case:<7} {p['median_ms']:>9.2f} ms ({p['backend']}, {p['calls']} calls)")
    return lines


# ---------------------------------------------------------------------------------------------
# graphs
# ---------------------------------------------------------------------------------------------


def run_graphs(ctx: SectionContext) -> None:
    from vllm_omni.platforms.device_graphs import all_graph_counters

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
    "render_token2wav",
    "resampler",
    "run_graphs",
    "run_prompt_path",
    "run_token2wav",
]
