# SPDX-License-Identifier: Apache-2.0
"""The CAM++ and fbank sections of the device check: parity with onnxruntime, per-call latency, front end.

The issue's headline goals live here: CAM++ graph-replayed at T=200 in <= 1.0 ms per call on an H200
(TensorRT anchor 3.6 ms, onnxruntime CPU 50-155 ms) with cosine >= 0.99999 and max abs <= 1e-3 vs
onnxruntime. Backends, all built from the same campplus.onnx:

| row                  | what runs                                                                       |
|----------------------|---------------------------------------------------------------------------------|
| `onnxruntime-cpu-1t` | the upstream session: CPU provider, ORT_ENABLE_ALL, 1 intra-op thread           |
| `torch-eager`        | `CampplusTorch` (folded CAM++) on the device, one kernel launch per op           |
| `torch-graph`        | `GraphedCampplus`: the same, replayed from a device graph per shape (incl. input checks) |
| `graph-replay`       | its `DeviceGraphRunner` alone on the device-resident bucketed launch (no checks) |
| `torch-eager-strict` | parity only, CUDA only: `torch-eager` with TF32 convolutions off                 |
| `tensorrt`           | `TrtSpeakerEmbedding`, when the tensorrt package is importable (CUDA)            |

The torch backends use seg-pool mode "auto", i.e. the numerics of the installed onnxruntime, so the
parity rows compare like with like. Inputs are the serving transform (mean-normalised Kaldi fbank)
of the shipped real speech clip, tiled to exactly T frames. Latency is host wall time per call with
the device synchronised before and after (what a caller waits for); calls of all backends are
interleaved in rounds so drifting clocks or load reach every backend alike.
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import torch

from vllm_omni_token2wav.benchmarks.common import timed_ms
from vllm_omni_token2wav.benchmarks.device_check.sections import SectionSkip

if TYPE_CHECKING:
    from vllm_omni_token2wav.benchmarks.device_check.sections import SectionContext

FRAMES: Final = (97, 200, 501, 1000, 3000)
SMOKE_FRAMES: Final = (97, 200)
LATENCY_FRAMES: Final = (200, 97, 501, 1000, 3000)  # the goal's T first: measured even if time runs out
SMOKE_LATENCY_FRAMES: Final = (200, 97)
ORT_CALLS: Final = 20
DEVICE_CALLS: Final = 200
SMOKE_CALLS: Final = 3
ROUNDS: Final = 4
FBANK_SECONDS: Final = (3.0, 10.0, 30.0)
SMOKE_FBANK_SECONDS: Final = (1.0,)
GOAL_FRAMES: Final = 200
GOAL_MS: Final = 1.0
GOAL_COSINE: Final = 0.99999
GOAL_MAX_ABS: Final = 1e-3
SAMPLE_RATE: Final = 16000
FRAME_LEN: Final = 400
FRAME_SHIFT: Final = 160


# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------


def speech_waveform(samples: int) -> np.ndarray:
    """The shipped 16 kHz speech clip tiled (from 0.5 s in) to `samples` samples."""
    from vllm_omni_token2wav.assets.audio import speech_sample

    speech, rate = speech_sample()
    if rate != SAMPLE_RATE:
        raise ValueError(f"the shipped speech clip is {rate} Hz, expected {SAMPLE_RATE}")
    offset = SAMPLE_RATE // 2
    reps = -(-(samples + offset) // speech.shape[0])
    return np.ascontiguousarray(np.tile(speech, reps)[offset : offset + samples])


def speech_features(frames: int) -> torch.Tensor:
    """The CAM++ serving input [frames, 80] (CPU, float32) of the tiled speech clip: exactly `frames` frames."""
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.features import speaker_features

    wav = speech_waveform(FRAME_LEN + FRAME_SHIFT * (frames - 1))
    feats = speaker_features(torch.from_numpy(wav))
    assert isinstance(feats, torch.Tensor) and feats.shape[0] == frames
    return feats


def agreement(got: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """cosine, max |got - ref|, relative L2 ||got - ref|| / ||ref|| (float64) and the reference's rms."""
    g, r = got.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    denom = float(np.linalg.norm(g) * np.linalg.norm(r))
    return {
        "cosine": float(g @ r / denom) if denom > 0 else math.nan,
        "max_abs": float(np.max(np.abs(g - r))),
        "rel_l2": float(np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-30)),
        "ref_rms": float(np.sqrt(np.mean(r * r))),
    }


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (an observed value; with few samples p99 is the maximum)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(math.ceil(q * len(ordered)) - 1, 0))]


def latency_row(values_ms: list[float]) -> dict[str, Any]:
    return {
        "n": len(values_ms),
        "p50_ms": statistics.median(values_ms),
        "p90_ms": percentile(values_ms, 0.90),
        "p99_ms": percentile(values_ms, 0.99),
        "min_ms": min(values_ms),
        "mean_ms": statistics.fmean(values_ms),
    }


@contextlib.contextmanager
def strict_fp32(device: torch.device) -> Iterator[None]:
    """TF32 convolutions off inside the block on CUDA (cuDNN's default allows them on Ampere and later)."""
    if device.type != "cuda":
        yield
        return
    cudnn = torch.backends.cudnn
    with cudnn.flags(
        enabled=cudnn.enabled, benchmark=cudnn.benchmark, deterministic=cudnn.deterministic, allow_tf32=False
    ):
        yield


# ---------------------------------------------------------------------------------------------
# assets
# ---------------------------------------------------------------------------------------------


def run_assets(ctx: SectionContext) -> None:
    """campplus.onnx (given, or the deterministic full-size stand-in, exported on first use) and its torch load."""
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import load_campplus_from_onnx

    start = time.perf_counter()
    if ctx.config.onnx is not None:
        path = ctx.config.onnx
        if not path.is_file():
            raise FileNotFoundError(f"--onnx {path}: no such file")
        from vllm_omni_token2wav.known_files import identify_file

        kind = f"given: {identify_file(path).label}"
    else:
        from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
            ensure_standin_campplus_onnx,
        )

        path = ensure_standin_campplus_onnx(seed=ctx.config.seed)
        kind = "stand-in (full size, seeded random weights)"
    ctx.result["campplus_onnx"] = {"kind": kind, "path": str(path), "bytes": path.stat().st_size}
    ctx.result["ensure_s"] = time.perf_counter() - start
    start = time.perf_counter()
    model = load_campplus_from_onnx(path, seg_pool_mode="auto")
    ctx.result["load_s"] = time.perf_counter() - start
    ctx.result["seg_pool_mode"] = model.seg_pool_mode
    ctx.shared["campplus_onnx"] = path
    ctx.shared["campplus_model"] = model


def render_assets(result: dict[str, Any]) -> list[str]:
    onnx = result["campplus_onnx"]
    return [
        f"campplus.onnx: {onnx['kind']}, {onnx['bytes'] / 1e6:.1f} MB, ready in {result['ensure_s']:.1f} s, "
        f"loaded into torch in {result.get('load_s', math.nan):.1f} s (seg-pool {result.get('seg_pool_mode')})"
    ]


def campplus_backends(ctx: SectionContext) -> dict[str, Any]:
    """The CAM++ backends of the parity and latency sections, built once per check (kept in `ctx.shared`)."""
    if "campplus_backends" in ctx.shared:
        return ctx.shared["campplus_backends"]  # type: ignore[no-any-return]
    if "campplus_model" not in ctx.shared:
        raise SectionSkip("the assets section did not load campplus.onnx")
    from vllm_omni_token2wav.model_executor.models.speaker_embedding import trt as speaker_embedding_trt
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.graphed import GraphedCampplus
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.ort import OrtSpeakerEmbedding
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import CampplusTorch

    path, model, device = ctx.shared["campplus_onnx"], ctx.shared["campplus_model"], ctx.device
    builds: dict[str, float] = {}
    backends: dict[str, Any] = {}

    def build(name: str, make: Callable[[], Any]) -> None:
        start = time.perf_counter()
        backends[name] = make()
        ctx.sync()
        builds[name] = time.perf_counter() - start

    build("onnxruntime-cpu-1t", lambda: OrtSpeakerEmbedding(path, torch.device("cpu"), intra_op_num_threads=1))
    build("torch-eager", lambda: CampplusTorch(model, device))
    build("torch-graph", lambda: GraphedCampplus(model, device, graph_api=ctx.graph_api))
    reason = speaker_embedding_trt.tensorrt_unavailable_reason() if device.type == "cuda" else "not a CUDA device"
    if reason is None:
        try:
            build("tensorrt", lambda: speaker_embedding_trt.TrtSpeakerEmbedding(path, device))
        except Exception as exc:  # an engine build failure is a result to record, not a reason to stop
            reason = f"TensorRT engine build failed: {type(exc).__name__}: {exc}"
    ctx.shared["campplus_backends"] = backends
    ctx.shared["campplus_build_s"] = builds
    ctx.shared["tensorrt_reason"] = reason
    return backends


# ---------------------------------------------------------------------------------------------
# campplus_parity
# ---------------------------------------------------------------------------------------------


def run_parity(ctx: SectionContext) -> None:
    backends = campplus_backends(ctx)
    ctx.result["build_s"] = ctx.shared["campplus_build_s"]
    ctx.result["tensorrt"] = ctx.shared["tensorrt_reason"] or "used"
    ort = backends["onnxruntime-cpu-1t"]
    device_backends = {name: b for name, b in backends.items() if name != "onnxruntime-cpu-1t"}
    rows: list[dict[str, Any]] = ctx.result.setdefault("rows", [])
    for frames in SMOKE_FRAMES if ctx.smoke else FRAMES:
        if ctx.out_of_time():
            ctx.note(f"out of time before T={frames}")
            break
        feats = speech_features(frames)
        reference = ort(feats).double().numpy()[0]
        on_device = feats.to(ctx.device)
        for name, backend in device_backends.items():
            got = backend(on_device)
            rows.append({"frames": frames, "backend": name, **agreement(got.cpu().numpy()[0], reference)})
        if ctx.device.type == "cuda":
            try:
                with strict_fp32(ctx.device):
                    got = device_backends["torch-eager"](on_device)
            except Exception as exc:  # a torch without the cuDNN flags context: the other rows still count
                ctx.note(f"torch-eager-strict not measured: {type(exc).__name__}: {exc}")
            else:
                strict = agreement(got.cpu().numpy()[0], reference)
                rows.append({"frames": frames, "backend": "torch-eager-strict", **strict})
        ctx.flush()
    ctx.result["graph_counters"] = backends["torch-graph"].counters().as_dict()
    graph_rows = [r for r in rows if r["backend"] == "torch-graph"]
    if graph_rows:
        worst_cos = min(r["cosine"] for r in graph_rows)
        worst_abs = max(r["max_abs"] for r in graph_rows)
        measured = sorted({r["frames"] for r in graph_rows})
        where = f"torch-graph vs onnxruntime CPU, T {measured}, {ctx.device}"
        ctx.goal("campplus_cosine_min", worst_cos, f">= {GOAL_COSINE}", worst_cos >= GOAL_COSINE, where)
        ctx.goal("campplus_max_abs", worst_abs, f"<= {GOAL_MAX_ABS}", worst_abs <= GOAL_MAX_ABS, where)


def render_parity(result: dict[str, Any]) -> list[str]:
    lines = [f"{'T':>5} {'backend':<20} {'cosine':>12} {'max abs':>10} {'rel L2':>10} {'ref rms':>8}"]
    for r in result.get("rows", []):
        lines.append(
            f"{r['frames']:>5} {r['backend']:<20} {r['cosine']:>12.9f} {r['max_abs']:>10.3g} "
            f"{r['rel_l2']:>10.3g} {r['ref_rms']:>8.3f}"
        )
    lines.append(f"tensorrt: {result.get('tensorrt')}")
    return lines


# ---------------------------------------------------------------------------------------------
# campplus_latency
# ---------------------------------------------------------------------------------------------


def run_latency(ctx: SectionContext) -> None:
    backends = campplus_backends(ctx)
    graphed = backends["torch-graph"]
    frames_list = SMOKE_LATENCY_FRAMES if ctx.smoke else LATENCY_FRAMES
    ort_calls, device_calls = (SMOKE_CALLS, SMOKE_CALLS) if ctx.smoke else (ORT_CALLS, DEVICE_CALLS)
    rows: list[dict[str, Any]] = ctx.result.setdefault("rows", [])
    ctx.result["calls"] = {"onnxruntime": ort_calls, "device": device_calls, "rounds": ROUNDS}
    ctx.result["graphs_active"] = graphed.runner.graphs_active
    memory_before = ctx.platform.memory_stats(ctx.device) if ctx.device.type != "cpu" else None
    for index, frames in enumerate(frames_list):
        share_end = time.monotonic() + ctx.time_left() / (len(frames_list) - index)
        if ctx.out_of_time(reserve_s=1.0):
            ctx.note(f"out of time before T={frames}")
            break
        feats = speech_features(frames)
        on_device = feats.to(ctx.device)
        launch = graphed.launch_inputs(on_device)  # what torch-graph replays: [1, frame bucket, 80] + lengths
        cases: dict[str, tuple[Callable[[], Any], int]] = {}
        for name, backend in backends.items():
            on_cpu = name == "onnxruntime-cpu-1t"
            cases[name] = (
                functools.partial(backend, feats if on_cpu else on_device),
                ort_calls if on_cpu else device_calls,
            )
        cases["graph-replay"] = (functools.partial(graphed.runner, *launch), device_calls)
        for fn, _ in cases.values():  # warm-up: sessions, cuDNN plans, the graph capture of this shape
            fn()
            fn()
        ctx.sync()
        times: dict[str, list[float]] = {name: [] for name in cases}
        stopped = False
        for round_index in range(ROUNDS):
            for name, (fn, calls) in cases.items():
                per_round = calls // ROUNDS + (1 if round_index < calls % ROUNDS else 0)
                for _ in range(per_round):
                    if time.monotonic() > share_end and all(times[n] for n in cases):
                        stopped = True
                        break
                    times[name].append(timed_ms(fn, ctx.sync))
                if stopped:
                    break
            if stopped:
                break
        if stopped:
            ctx.partial = True
            ctx.note(f"T={frames}: time share used up after {sum(map(len, times.values()))} calls")
        ort_p50 = statistics.median(times["onnxruntime-cpu-1t"]) if times["onnxruntime-cpu-1t"] else None
        for name, values in times.items():
            if values:
                row = {"frames": frames, "backend": name, **latency_row(values)}
                row["ort_p50_over_this"] = ort_p50 / row["p50_ms"] if ort_p50 else None
                rows.append(row)
        ctx.result["graph_counters"] = graphed.counters().as_dict()
        ctx.flush()
    if memory_before is not None:
        ctx.result["memory_before"] = memory_before
        ctx.result["memory_after"] = ctx.platform.memory_stats(ctx.device)
    goal_row = next((r for r in rows if r["frames"] == GOAL_FRAMES and r["backend"] == "torch-graph"), None)
    if goal_row is not None:
        name = ctx.platform.get_device_name(ctx.device.index) if ctx.device.type != "cpu" else "cpu"
        passed = goal_row["p50_ms"] <= GOAL_MS if "H200" in name and graphed.runner.graphs_active else None
        ctx.goal(
            "campplus_graph_p50_ms_T200",
            goal_row["p50_ms"],
            f"<= {GOAL_MS} ms on an H200",
            passed,
            f"torch-graph p50 over {goal_row['n']} calls on {name} ({ctx.device})",
        )


def render_latency(result: dict[str, Any]) -> list[str]:
    lines = [f"{'T':>5} {'backend':<20} {'n':>4} {'p50 ms':>9} {'p99 ms':>9} {'min ms':>9} {'ORT/this':>9}"]
    for r in result.get("rows", []):
        ratio = "-" if r.get("ort_p50_over_this") is None else f"{r['ort_p50_over_this']:.1f}x"
        lines.append(
            f"{r['frames']:>5} {r['backend']:<20} {r['n']:>4} {r['p50_ms']:>9.3f} {r['p99_ms']:>9.3f} "
            f"{r['min_ms']:>9.3f} {ratio:>9}"
        )
    counters = result.get("graph_counters")
    if counters:
        lines.append(
            f"graphs: {counters['backend']}, {counters['captures']} captures ({counters['capture_ms']:.0f} ms), "
            f"{counters['replays']} replays, {counters['eager_fallbacks']} eager fallbacks, "
            f"{counters['failures']} failures"
            + (f", off: {counters['disabled_reason']}" if counters["disabled_reason"] else "")
        )
    return lines


# ---------------------------------------------------------------------------------------------
# fbank
# ---------------------------------------------------------------------------------------------


def run_fbank(ctx: SectionContext) -> None:
    """`speaker_features` (fbank - mean) on the device vs on the CPU: agreement and latency."""
    from vllm_omni_token2wav.model_executor.models.audio.dft import default_dft_impl
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.features import speaker_features

    ctx.result["dft_impl"] = default_dft_impl()
    rows: list[dict[str, Any]] = ctx.result.setdefault("rows", [])
    cpu_calls, device_calls = (SMOKE_CALLS, SMOKE_CALLS) if ctx.smoke else (10, 50)
    for seconds in SMOKE_FBANK_SECONDS if ctx.smoke else FBANK_SECONDS:
        if ctx.out_of_time(reserve_s=1.0):
            ctx.note(f"out of time before {seconds:g} s")
            break
        wav = torch.from_numpy(speech_waveform(int(seconds * SAMPLE_RATE)))
        on_device = wav.to(ctx.device)
        cpu_feats = speaker_features(wav)
        device_feats = speaker_features(on_device)
        assert isinstance(cpu_feats, torch.Tensor) and isinstance(device_feats, torch.Tensor)
        diff = (device_feats.cpu().double() - cpu_feats.double()).abs()
        cpu_ms = [timed_ms(functools.partial(speaker_features, wav), ctx.sync) for _ in range(cpu_calls)]
        device_ms = [timed_ms(functools.partial(speaker_features, on_device), ctx.sync) for _ in range(device_calls)]
        rows.append(
            {
                "seconds": seconds,
                "frames": int(cpu_feats.shape[0]),
                "max_abs": float(diff.max()),
                "mean_abs": float(diff.mean()),
                "cpu": latency_row(cpu_ms),
                "device": latency_row(device_ms),
            }
        )
        ctx.flush()


def render_fbank(result: dict[str, Any]) -> list[str]:
    lines = [
        f"dft: {result.get('dft_impl')}",
        f"{'audio':>6} {'frames':>6} {'max abs':>9} {'cpu p50':>9} {'dev p50':>9}",
    ]
    for r in result.get("rows", []):
        lines.append(
            f"{r['seconds']:>5g}s {r['frames']:>6} {r['max_abs']:>9.2g} {r['cpu']['p50_ms']:>7.2f}ms "
            f"{r['device']['p50_ms']:>7.2f}ms"
        )
    return lines


__all__ = [
    "FRAMES",
    "LATENCY_FRAMES",
    "agreement",
    "campplus_backends",
    "latency_row",
    "percentile",
    "render_assets",
    "render_fbank",
    "render_latency",
    "render_parity",
    "run_assets",
    "run_fbank",
    "run_latency",
    "run_parity",
    "speech_features",
    "speech_waveform",
    "strict_fp32",
]
