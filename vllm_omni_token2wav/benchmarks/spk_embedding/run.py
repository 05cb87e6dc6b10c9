# SPDX-License-Identifier: Apache-2.0
"""Measure the CAM++ speaker-embedding backends side by side: parity with onnxruntime and latency.

The question an operator of this fork asks first is "on my hardware, does the device speaker
embedding match onnxruntime, and how much faster is it?". This module answers it in one process:
the onnxruntime CPU session (the upstream behaviour and the reference), the torch CAM++ on the
serving device (`get_campplus_torch`) and, on CUDA hosts with TensorRT, the TensorRT engine all
embed the same serving-transform features (Kaldi fbank minus mean of a real speech clip, cut to T
frames), interleaved call by call so that machine drift hits every backend alike.

Every backend runs at each thread budget of `threads` (default 1 and the usable cores): onnxruntime
with that many intra-op threads (one session per budget), torch with that many intra-op threads
for the call (`platforms.cpu.threads.intra_op_threads`). Each cell's ratio compares the same
budget; the best-of rows take each backend's fastest budget, and one verdict per T says which
backend is faster at its best (`speed_verdicts`).

Timing of one call (all clocks read in the calling thread):

| field      | clock                     | interval                                             |
|------------|---------------------------|------------------------------------------------------|
| `host`     | `time.perf_counter_ns`    | call until it returns, before synchronising          |
| `host_cpu` | `time.thread_time_ns`     | CPU time the calling thread spent inside the call    |
| `wall`     | `time.perf_counter_ns`    | call until `platform.synchronize(device)` returned   |

On the CPU `host == wall`; on an asynchronous device the gap is the work still queued when the
call returned, i.e. host time the serving thread gets back. `ratio_vs_ort` is the backend's median
`wall` divided by the onnxruntime median `wall` at the same T (below 1: faster than onnxruntime).

The report object is filled while the run progresses, so an interrupted run (Ctrl-C) still has
everything measured so far; `vllm_omni_token2wav.benchmarks.spk_embedding.report` renders it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform as py_platform
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np
import torch

from vllm_omni_token2wav.benchmarks.common import cpu_model, load_average, resolve_device, usable_cores
from vllm_omni_token2wav.file_identity import file_sha256
from vllm_omni_token2wav.known_files import official_file
from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

SCHEMA: Final = "vllm-omni/bench-spk-embedding/2"
#: The official campplus.onnx digest, from the one table of known files.
KNOWN_SHIPPED_SHA256: Final = official_file("campplus.onnx").sha256
BACKENDS: Final = ("ort", "torch", "trt")
DEFAULT_LENGTHS: Final = (97, 200, 501, 1000, 3000)
FAST_LENGTHS: Final = (97, 200)
MIN_FRAMES: Final = 4  # CAM++ statistics pooling needs ceil(T/2) >= 2; TensorRT profiles start at 4
SAMPLE_RATE: Final = 16000
# Kaldi fbank framing of the serving transform (25 ms window, 10 ms shift, snip_edges):
# T frames need exactly FRAME_LENGTH + (T - 1) * FRAME_SHIFT samples.
FRAME_LENGTH: Final = 400
FRAME_SHIFT: Final = 160
EMBEDDING_DIM: Final = 192
# Pause between two timed calls, so that the thread pools of the previous call have gone to sleep
# before the next one starts: after a call, an onnxruntime intra-op worker keeps spinning on a core
# for ~55 ms and a libgomp (torch) worker for ~15 ms (measured on the 2-core host, per-thread
# schedstat). A call that starts earlier shares a core with that spinner, which costs OpenMP's
# static partitioning far more than onnxruntime's work stealing: with a 2 ms pause torch at 2
# threads measured 1.5-2.3x slower than alone. Serving never interleaves the two runtimes.
CALL_GAP_S: Final = 0.1
# Long utterances get fewer timed calls (the median of >= 10 is stable at these durations).
LONG_FRAMES: Final = 1000

# The torch backend is built with the segment-pooling semantics of the installed onnxruntime, so the
# parity columns measure the port, not the semantics choice. The serving default of
# `get_campplus_torch` is "legacy" (onnxruntime <= 1.28, what the flow models were trained on); against
# onnxruntime >= 1.29 ("exact") it differs by design wherever ceil(T/2) % 100 != 0 (see campplus.segpool).
TORCH_SEG_POOL_MODE: Final = "auto"

# Parity verdict on the raw 192-d output (worst row): the cosine, which is what the consumer sees (the
# flow model L2-normalises the embedding), plus the relative L2 error ||out - ref|| / ||ref||, which
# catches what a cosine cannot (a wrong scale). cosine 0.999999 alone allows a relative error of
# 1.4e-3, so these bounds agree; accelerators get the CAM++ port's device tolerance (cosine 0.9999).
# The raw max |diff| is reported too, but not judged: the stand-in's random weights give outputs of
# order 1e4 on real speech, where fp32 rounding alone exceeds any fixed absolute bound.
CPU_MIN_COSINE: Final = 0.999999
CPU_MAX_REL_L2: Final = 2e-3
DEVICE_MIN_COSINE: Final = 0.9999
DEVICE_MAX_REL_L2: Final = 2e-2


@dataclass(frozen=True)
class BenchConfig:
    """What to measure. Validated by the CLI; `validate()` re-checks what the library relies on."""

    onnx: Path | None = None  # None: the deterministic full-size stand-in, generated on first use
    device: str = "auto"
    backends: tuple[str, ...] = ("ort", "torch")
    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    batch: int = 1
    warmup: int = 5
    iters: int = 50
    threads: tuple[int, ...] = (1, 2)  # thread budgets; every backend runs at each
    audio: Path | None = None  # None: the speech clip shipped with the project
    prompt_cache_iters: int = 200
    add_trt_when_available: bool = False  # the CLI default: also measure TensorRT on CUDA hosts that have it

    def validate(self) -> None:
        unknown = [b for b in self.backends if b not in BACKENDS]
        if unknown or not self.backends or len(set(self.backends)) != len(self.backends):
            raise ValueError(f"backends must be distinct names from {BACKENDS}, got {self.backends}")
        if "ort" not in self.backends:
            raise ValueError("the 'ort' backend is the reference of the report and must be measured")
        if not self.lengths or any(t < MIN_FRAMES for t in self.lengths):
            raise ValueError(f"lengths must be frame counts >= {MIN_FRAMES}, got {self.lengths}")
        for name, value, low in (("batch", self.batch, 1), ("warmup", self.warmup, 0), ("iters", self.iters, 1)):
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        if not self.threads or min(self.threads) < 1 or len(set(self.threads)) != len(self.threads):
            raise ValueError(f"threads must be distinct counts >= 1, got {self.threads}")
        if self.prompt_cache_iters < 1:
            raise ValueError(f"prompt_cache_iters must be >= 1, got {self.prompt_cache_iters}")

    def iters_at(self, frames: int) -> int:
        """Timed calls at `frames`: `iters`, scaled down by T / 1000 above 1000 frames (at least 10)."""
        if frames <= LONG_FRAMES:
            return self.iters
        return min(self.iters, max(10, self.iters * LONG_FRAMES // frames))


class BenchSetupError(Exception):
    """An input of the run (weights file, audio, device, backend) cannot be used; the message says which and why."""


@contextlib.contextmanager
def _setup_step(what: str) -> Iterator[None]:
    """Turn the errors of one input's setup into a `BenchSetupError` naming that input."""
    try:
        yield
    except BenchSetupError:
        raise
    except _setup_error_types() as exc:
        raise BenchSetupError(f"{what}: {exc}") from exc


def _setup_error_types() -> tuple[type[BaseException], ...]:
    return (ValueError, OSError, RuntimeError, ImportError)


class Progress(Protocol):
    """Where the run reports what it is doing (the CLI draws a progress bar; the library never prints)."""

    def stage(self, text: str) -> None:
        """A setup step starts (stand-in generation, model build, ...)."""

    def start(self, total: int) -> None:
        """The timed loop starts: `total` calls will follow."""

    def advance(self, calls: int, text: str) -> None:
        """`calls` more timed calls are done; `text` says where the loop is."""


class _SilentProgress:
    def stage(self, text: str) -> None:
        logger.debug("%s", text)

    def start(self, total: int) -> None:
        pass

    def advance(self, calls: int, text: str) -> None:
        pass


@dataclass
class LatencyStats:
    """Summary of one clock over the timed calls of one backend at one T (milliseconds)."""

    n: int
    median_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float

    @classmethod
    def from_ns(cls, samples_ns: Sequence[int]) -> LatencyStats:
        if not samples_ns:
            raise ValueError("no samples to summarise")
        ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
        p50, p90, p99 = np.percentile(ms, [50, 90, 99])
        return cls(len(ms), float(p50), float(p90), float(p99), float(ms.mean()), float(ms.min()), float(ms.max()))


@dataclass
class WeightsInfo:
    """Which campplus.onnx was measured, and whether its embeddings mean anything."""

    path: str
    size_bytes: int
    sha256: str
    kind: str  # "official" | "stand-in" | "unknown" (`known_files.FileKind`)
    matches_known_shipped: bool
    known_shipped_sha256: str = KNOWN_SHIPPED_SHA256
    standin_generated_s: float | None = None  # set when this run generated the stand-in (first use)
    note: str = ""
    label: str = ""  # what reports print: "official CosyVoice campplus.onnx" | "stand-in" | "unknown file"


@dataclass
class AudioInfo:
    source: str
    sample_rate: int
    duration_s: float
    transform: str = "Kaldi fbank (80 bins, dither 0, 16 kHz) minus the per-utterance mean (serving transform)"


@dataclass
class EnvironmentInfo:
    python: str
    os: str
    cpu: str
    cpu_count: int | None
    usable_cores: int
    torch_version: str
    onnxruntime_version: str
    onnx_version: str
    numpy_version: str
    tensorrt_version: str | None
    platform: str
    device: str
    device_name: str
    threads: list[int]  # the thread budgets (torch intra-op threads per call = onnxruntime intra-op threads)
    torch_num_threads: int  # the process default, outside the timed calls
    ort_seg_pool_mode: str
    torch_seg_pool_mode: str | None
    load_average_start: tuple[float, float, float] | None
    load_average_end: tuple[float, float, float] | None = None
    timestamp_utc: str = ""
    vllm_omni_version: str = ""


@dataclass
class BuildTimes:
    """`get_campplus_torch`: first build (ONNX parse + mapping + move to device) and a cache hit."""

    torch_backend_name: str | None = None
    torch_cold_build_ms: float | None = None
    torch_cache_hit_us: float | None = None  # median over many hits
    trt_backend_name: str | None = None
    trt_build_or_load_s: float | None = None
    ort_session_build_ms: float | None = None


@dataclass
class PromptCacheTimes:
    """`StepAudio2Token2WavCore.prepare_prompt` on the speech clip: first call (miss) and repeat calls (hits)."""

    backend: str | None = None
    prompt_seconds: float | None = None
    miss_ms: float | None = None
    hit: LatencyStats | None = None
    unavailable: str | None = None  # why it was not measured


@dataclass
class PolicyChoice:
    """What the serving policy (`select_speaker_embedding_backend`, request "device") installs on this device."""

    device: str
    backend_name: str  # e.g. "onnxruntime-cpu", "torch-npu:0", "tensorrt-cuda:0"
    backend: str  # the report's key for it: "ort" | "torch" | "trt"
    rule: str  # where the choice comes from, for the verdict line


@dataclass
class CellResult:
    """One backend at one T: latency clocks, ratio and parity against onnxruntime in the same run."""

    backend: str  # "ort" | "torch" | "trt"
    backend_name: str  # what the backend calls itself, e.g. "torch-cpu", "tensorrt-cuda:0"
    frames: int
    batch: int
    threads: int  # the thread budget of the call (torch intra-op threads / onnxruntime intra-op threads)
    wall: LatencyStats
    host: LatencyStats
    host_cpu: LatencyStats
    threads_used: dict[str, int] | None = None  # torch on CPU: timed calls per intra-op thread count it chose
    ratio_vs_ort: float | None = None  # vs onnxruntime at the same thread budget
    paired_ratio_vs_ort: float | None = None  # median over iterations of (this call / the ORT call beside it)
    cosine_vs_ort: float | None = None
    max_abs_diff_vs_ort: float | None = None
    rel_l2_diff_vs_ort: float | None = None  # ||out - ort|| / ||ort||
    ort_max_abs: float | None = None  # largest |value| of the onnxruntime output (scale of max_abs_diff)
    parity_ok: bool | None = None


@dataclass
class BenchReport:
    """Everything one run measured; partial (`complete=False`) if the run was interrupted."""

    config: dict[str, Any]
    schema: str = SCHEMA
    complete: bool = False
    interrupted: bool = False
    elapsed_s: float = 0.0
    weights: WeightsInfo | None = None
    audio: AudioInfo | None = None
    environment: EnvironmentInfo | None = None
    build: BuildTimes = field(default_factory=BuildTimes)
    prompt_cache: PromptCacheTimes | None = None
    policy: PolicyChoice | None = None
    tolerances: dict[str, float] = field(default_factory=dict)
    results: list[CellResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        # The headline numbers again, keyed for lookup: ratio_vs_ort[backend][threads][T] (string keys).
        data["ratio_vs_ort"] = {
            backend: {
                str(n): {str(c.frames): c.ratio_vs_ort for c in self.results if c.backend == backend and c.threads == n}
                for n in dict.fromkeys(c.threads for c in self.results if c.backend == backend)
            }
            for backend in dict.fromkeys(c.backend for c in self.results)
        }
        data["speed_verdicts"] = [asdict(v) for v in speed_verdicts(self)]
        return data

    def cell(self, backend: str, frames: int, threads: int | None = None) -> CellResult | None:
        """The cell of `backend` at `frames` (and `threads`; None: the first measured budget)."""
        return next(
            (
                c
                for c in self.results
                if c.backend == backend and c.frames == frames and (threads is None or c.threads == threads)
            ),
            None,
        )

    @property
    def parity_failures(self) -> list[CellResult]:
        return [c for c in self.results if c.parity_ok is False]


@dataclass(frozen=True)
class BestOf:
    """A backend at T with the thread budget that gave its lowest median (wall)."""

    backend: str
    backend_name: str
    threads: int
    median_ms: float
    ratio_vs_best_ort: float | None  # this median / onnxruntime's best median at the same T


@dataclass(frozen=True)
class SpeedVerdict:
    """Which backend is fastest at T, each backend at its best thread budget (fastest first)."""

    frames: int
    faster: str  # backend key of the fastest, e.g. "torch"
    best: list[BestOf]


def best_of(report: BenchReport, frames: int) -> list[BestOf]:
    """Each backend's fastest thread budget at `frames`, fastest backend first."""
    fastest: dict[str, CellResult] = {}
    for c in report.results:
        if c.frames == frames and (c.backend not in fastest or c.wall.median_ms < fastest[c.backend].wall.median_ms):
            fastest[c.backend] = c
    ort = fastest.get("ort")
    rows = [
        BestOf(
            c.backend,
            c.backend_name,
            c.threads,
            c.wall.median_ms,
            c.wall.median_ms / ort.wall.median_ms if ort is not None else None,
        )
        for c in fastest.values()
    ]
    return sorted(rows, key=lambda b: b.median_ms)


def speed_verdicts(report: BenchReport) -> list[SpeedVerdict]:
    """One verdict per measured T (ascending): the fastest backend at its best budget."""
    verdicts = []
    for frames in sorted({c.frames for c in report.results}):
        rows = best_of(report, frames)
        verdicts.append(SpeedVerdict(frames, rows[0].backend, rows))
    return verdicts


# ---------------------------------------------------------------------------------------------
# Inputs: weights, audio, features
# ---------------------------------------------------------------------------------------------


def describe_weights(path: Path, *, standin: bool, generated_s: float | None = None) -> WeightsInfo:
    """sha256 and label of `path` (`known_files.identify_file`); `standin` marks a file in the stand-in cache."""
    from vllm_omni_token2wav.known_files import STANDIN_LABEL, identify_file

    origin = identify_file(path)
    sha = origin.sha256 or file_sha256(path)
    shipped = origin.kind == "official"
    if origin.kind == "stand-in" or (standin and not shipped):
        kind, label = "stand-in", STANDIN_LABEL
        note = (
            "STAND-IN weights: a deterministic CAM++ export with random weights. Latency is representative "
            "of the real file (for the full-size stand-in); the embeddings are not a real speaker space."
        )
    elif shipped:
        kind, label = "official", origin.label
        note = f"{origin.label}: the file shipped with CosyVoice / Step-Audio2 / MiniCPM-o assets"
    else:
        kind, label = "unknown", origin.label
        note = f"unknown file: not the official campplus.onnx (sha256 differs from {KNOWN_SHIPPED_SHA256[:12]}...)"
    size = path.stat().st_size
    return WeightsInfo(
        str(path.resolve()), size, sha, kind, shipped, KNOWN_SHIPPED_SHA256, generated_s, note, label=label
    )


def is_generated_standin(path: Path) -> bool:
    """Whether `path` lies in the folder where `campplus.standin` caches its generated files."""
    from vllm_omni_token2wav import envs

    folder = envs.cache_dir("standins", "campplus").resolve()
    return path.resolve().parent == folder


def resolve_weights(onnx: Path | None, progress: Progress) -> WeightsInfo:
    """The measured file: `onnx`, or the full-size stand-in (generated and cached on first use)."""
    if onnx is not None:
        return describe_weights(onnx, standin=is_generated_standin(onnx))
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus import standin

    path = standin.standin_path(seed=0, reduced=False)
    generated_s = None
    if not path.is_file():
        progress.stage(f"generating the stand-in campplus.onnx (first use only; cached as {path})")
        start = time.perf_counter()
        path = standin.ensure_standin_campplus_onnx(seed=0, reduced=False)
        generated_s = time.perf_counter() - start
    return describe_weights(Path(path), standin=True, generated_s=generated_s)


def load_clip(audio: Path | None) -> tuple[np.ndarray, AudioInfo]:
    """The 16 kHz mono float32 waveform the features are cut from: `audio`, or the shipped speech clip."""
    from vllm_omni_token2wav.model_executor.models.audio import load_audio

    if audio is None:
        from vllm_omni_token2wav.assets.audio import speech_sample

        wave, rate = speech_sample()
        source = "vllm_omni_token2wav.assets.audio.speech_sample()"
        clip = load_audio((np.asarray(wave), int(rate)), SAMPLE_RATE)
    else:
        source = str(audio)
        # Only T frames are used; a long file is cut rather than rejected.
        clip = load_audio(audio, SAMPLE_RATE, max_seconds=120.0, truncate=True)
    clip = _as_numpy_wave(clip)
    if clip.size < FRAME_LENGTH:
        raise ValueError(f"{source}: {clip.size} samples at 16 kHz is shorter than one 25 ms fbank frame")
    return clip, AudioInfo(source, SAMPLE_RATE, clip.size / SAMPLE_RATE)


def _as_numpy_wave(value: Any) -> np.ndarray:
    # load_audio may return an array, a tensor, or (waveform, rate); the benchmark needs a flat float32 array.
    if isinstance(value, tuple):
        value = value[0]
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    wave = np.asarray(value, dtype=np.float32)
    if wave.ndim == 2 and 1 in wave.shape:
        wave = wave.reshape(-1)
    if wave.ndim != 1:
        raise ValueError(f"expected a mono waveform, got an array of shape {wave.shape}")
    return wave


def samples_for_frames(frames: int) -> int:
    """Samples of 16 kHz audio that the Kaldi framing (25 ms / 10 ms, snip_edges) turns into `frames` frames."""
    return FRAME_LENGTH + (frames - 1) * FRAME_SHIFT


def features_of_length(clip: np.ndarray, frames: int) -> torch.Tensor:
    """Serving-transform features `[frames, 80]` of `clip`, tiled (or cropped) to exactly that many frames."""
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.features import speaker_features

    wave = np.resize(clip, samples_for_frames(frames)).astype(np.float32, copy=False)
    feat = speaker_features(torch.from_numpy(wave))
    if not isinstance(feat, torch.Tensor):
        feat = torch.as_tensor(np.asarray(feat))
    feat = feat.to(torch.float32)
    if tuple(feat.shape) != (frames, 80):
        raise RuntimeError(
            f"speaker_features gave shape {tuple(feat.shape)} for {wave.size} samples, expected ({frames}, 80)"
        )
    return feat.contiguous()


# ---------------------------------------------------------------------------------------------
# Backends as the benchmark drives them
# ---------------------------------------------------------------------------------------------


@dataclass
class _Runner:
    """One backend at one thread budget, reduced to what the timing loop needs: a call on the prepared input."""

    key: str  # "ort" | "torch" | "trt"
    name: str
    run: Callable[[torch.Tensor], torch.Tensor]
    threads: int
    used: list[int] = field(default_factory=list)  # intra-op threads each torch call actually ran with

    @property
    def label(self) -> str:
        return f"{self.key}@{self.threads}"


def _ort_runner(onnx: Path, device: torch.device, threads: int) -> tuple[_Runner, float]:
    """The reference: a CPU onnxruntime session with upstream's settings, `threads` intra-op threads.

    Built here rather than through the facade's `OrtSpeakerEmbedding` so that any CAM++ export
    (also the reduced-width stand-ins of the tests, whose embedding is narrower) and `[B, T, 80]`
    batches can be measured; the settings are the same (CPUExecutionProvider, ORT_ENABLE_ALL). Like
    the facade's fallback it takes the features from, and returns the embedding to, `device`.
    """
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    start = time.perf_counter()
    try:
        session = onnxruntime.InferenceSession(str(onnx), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's pybind exception types do not share a useful base class
        raise BenchSetupError(f"--onnx {onnx}: onnxruntime cannot load it ({type(exc).__name__}: {exc})") from exc
    build_ms = (time.perf_counter() - start) * 1e3
    inputs = session.get_inputs()
    if len(inputs) != 1:
        raise BenchSetupError(f"--onnx {onnx}: expected one input [B,T,80], got {[i.name for i in inputs]}")
    input_name = inputs[0].name  # the shipped file says "input"; read it from the session anyway

    def run(x: torch.Tensor) -> torch.Tensor:
        (out,) = session.run(None, {input_name: x.detach().to("cpu", torch.float32).contiguous().numpy()})
        return torch.from_numpy(out).to(device)

    return _Runner("ort", "onnxruntime-cpu", run, threads), build_ms


def _torch_runner(model: Any, batch: int, threads: int) -> _Runner:
    from vllm_omni_token2wav.platforms.cpu.threads import intra_op_threads

    runner = _Runner("torch", str(model.name), lambda x: x, threads)

    def run(x: torch.Tensor) -> torch.Tensor:
        with intra_op_threads(threads):
            out = model(x[0]) if batch == 1 else model.embed_batch(list(x.unbind(0)))
        used = getattr(model, "last_call_threads", None)
        runner.used.append(threads if used is None else used)
        return out

    runner.run = run
    return runner


def _trt_runners(onnx: Path, device: torch.device, threads: Sequence[int]) -> tuple[list[_Runner], float]:
    """One engine; a runner per thread budget (the host threads only launch it)."""
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.trt import TrtSpeakerEmbedding
    from vllm_omni_token2wav.platforms.cpu.threads import intra_op_threads

    start = time.perf_counter()
    backend = TrtSpeakerEmbedding(onnx, device)
    seconds = time.perf_counter() - start

    def runner(n: int) -> _Runner:
        def run(x: torch.Tensor) -> torch.Tensor:
            with intra_op_threads(n):
                return torch.cat([backend(row) for row in x.unbind(0)], dim=0)

        return _Runner("trt", backend.name, run, n)

    return [runner(n) for n in threads], seconds


def trt_unavailable_reason(device: torch.device) -> str | None:
    """Why the TensorRT backend cannot run on `device` here, or None."""
    if device.type != "cuda":
        return f"the TensorRT backend needs a CUDA device; this run uses {device}"
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.trt import tensorrt_unavailable_reason

    return tensorrt_unavailable_reason()


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParityMetrics:
    """One backend's output against onnxruntime's for the same input (worst row for batches)."""

    cosine: float
    max_abs_diff: float
    rel_l2_diff: float
    ref_max_abs: float

    def ok(self, tol: dict[str, float]) -> bool:
        return self.cosine >= tol["min_cosine"] and self.rel_l2_diff <= tol["max_rel_l2_diff"]


def parity(out: torch.Tensor, ref: torch.Tensor) -> ParityMetrics:
    """Compare two `[B, E]` outputs in float64 (see the tolerance comment at the top of the module)."""
    if out.shape != ref.shape:
        raise RuntimeError(f"backend output has shape {tuple(out.shape)}, onnxruntime gave {tuple(ref.shape)}")
    a = out.detach().to("cpu", torch.float64).reshape(-1, out.shape[-1])
    b = ref.detach().to("cpu", torch.float64).reshape(-1, ref.shape[-1])
    cos = torch.nn.functional.cosine_similarity(a, b, dim=1, eps=1e-30)
    rel = (a - b).norm(dim=1) / b.norm(dim=1).clamp_min(1e-30)
    return ParityMetrics(float(cos.min()), float((a - b).abs().max()), float(rel.max()), float(b.abs().max()))


def tolerances_for(device: torch.device) -> dict[str, float]:
    if device.type == "cpu":
        return {"min_cosine": CPU_MIN_COSINE, "max_rel_l2_diff": CPU_MAX_REL_L2}
    return {"min_cosine": DEVICE_MIN_COSINE, "max_rel_l2_diff": DEVICE_MAX_REL_L2}


def _environment(
    device: torch.device, threads: Sequence[int], torch_seg_pool: str | None, trt: str | None
) -> EnvironmentInfo:
    import onnx
    import onnxruntime

    from vllm_omni_token2wav import platforms
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus import ort_seg_pool_mode
    from vllm_omni_token2wav.version import __version__

    platform = platforms.current_omni_platform
    name = platform.get_device_name(device.index) if device.type != "cpu" else cpu_model()
    return EnvironmentInfo(
        python=py_platform.python_version(),
        os=f"{py_platform.system()} {py_platform.release()}",
        cpu=cpu_model(),
        cpu_count=os.cpu_count(),
        usable_cores=usable_cores(),
        torch_version=torch.__version__,
        onnxruntime_version=onnxruntime.__version__,
        onnx_version=onnx.__version__,
        numpy_version=np.__version__,
        tensorrt_version=trt,
        platform=platform.device_type,
        device=str(device),
        device_name=name,
        threads=list(threads),
        torch_num_threads=torch.get_num_threads(),
        ort_seg_pool_mode=ort_seg_pool_mode(),
        torch_seg_pool_mode=torch_seg_pool,
        load_average_start=load_average(),
        timestamp_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        vllm_omni_version=__version__,
    )


def _model_seg_pool_mode(model: Any) -> str | None:
    # The torch backend wraps a CAMPPlus; report the segment-pooling semantics it resolved to.
    for obj in (model, getattr(model, "model", None), getattr(model, "module", None)):
        mode = getattr(obj, "seg_pool_mode", None) if obj is not None else None
        if isinstance(mode, str):
            return mode
    return None


class SpkEmbeddingBenchmark:
    """One run of the report. `run()` fills `self.report` step by step (so Ctrl-C keeps what was measured)."""

    def __init__(self, config: BenchConfig, progress: Progress | None = None) -> None:
        config.validate()
        self.config = config
        self.progress: Progress = progress if progress is not None else _SilentProgress()
        self.report = BenchReport(config=_config_dict(config))
        self._start = 0.0

    def run(self) -> BenchReport:
        self._start = time.perf_counter()
        try:
            self._run()
            self.report.complete = True
        except KeyboardInterrupt:
            self.report.interrupted = True
            raise
        finally:
            self.report.elapsed_s = round(time.perf_counter() - self._start, 3)
            if self.report.environment is not None:
                self.report.environment.load_average_end = load_average()
        return self.report

    def _run(self) -> None:
        cfg, report, progress = self.config, self.report, self.progress
        with _setup_step("--device"):
            device = resolve_device(cfg.device)
        if "trt" in cfg.backends:
            reason = trt_unavailable_reason(device)
            if reason is not None:
                raise BenchSetupError(f"--backends trt: TensorRT backend requested but {reason}")
        elif cfg.add_trt_when_available and trt_unavailable_reason(device) is None:
            cfg = dataclasses.replace(cfg, backends=(*cfg.backends, "trt"))
            self.config = cfg
            report.config["backends"] = list(cfg.backends)
        report.tolerances = tolerances_for(device)

        with _setup_step("--onnx" if cfg.onnx is not None else "stand-in campplus.onnx"):
            report.weights = resolve_weights(cfg.onnx, progress)
        onnx = Path(report.weights.path)
        if report.weights.kind == "stand-in":
            report.notes.append(report.weights.note)

        progress.stage("speech clip and serving-transform features")
        with _setup_step(f"--audio {cfg.audio}" if cfg.audio is not None else "shipped speech clip"):
            clip, report.audio = load_clip(cfg.audio)
        lengths = sorted(set(cfg.lengths))
        inputs = {t: features_of_length(clip, t).unsqueeze(0).repeat(cfg.batch, 1, 1).to(device) for t in lengths}

        runners: list[_Runner] = []
        torch_model = None
        # The torch loader goes first: its cold build must be the first in the process, and for a file
        # that is not a CAM++ export its error names what does not map (onnxruntime would just run it).
        if "torch" in cfg.backends:
            progress.stage(f"torch CAM++ on {device} (cold build, then cache hits)")
            with _setup_step("--onnx"):  # the loader's message names the file
                torch_model = self._measure_torch_build(onnx, device)
        progress.stage("onnxruntime CPU sessions")
        for n in cfg.threads:
            with _setup_step("--onnx"):
                ort, build_ms = _ort_runner(onnx, device, n)
            if report.build.ort_session_build_ms is None:
                report.build.ort_session_build_ms = build_ms
            runners.append(ort)
            if torch_model is not None:
                runners.append(_torch_runner(torch_model, cfg.batch, n))
        trt_version = None
        if "trt" in cfg.backends:
            progress.stage(f"TensorRT engine on {device} (built and cached on first use)")
            with _setup_step("--backends trt"):
                trt_runners, report.build.trt_build_or_load_s = _trt_runners(onnx, device, cfg.threads)
            report.build.trt_backend_name = trt_runners[0].name
            runners.extend(trt_runners)
            import tensorrt

            trt_version = str(getattr(tensorrt, "__version__", "unknown"))

        report.environment = _environment(
            device, cfg.threads, _model_seg_pool_mode(torch_model) if torch_model is not None else None, trt_version
        )
        self._measure_latency(runners, inputs, device)
        self._measure_prompt_cache(onnx, clip, device)
        try:
            report.policy = policy_choice(onnx, device, max(cfg.threads))
        except _setup_error_types() as exc:  # the verdict then says the policy could not be asked
            report.notes.append(f"serving policy not determined: {type(exc).__name__}: {exc}")

    def _measure_torch_build(self, onnx: Path, device: torch.device) -> Any:
        from vllm_omni_token2wav.model_executor.models.speaker_embedding import torch_backend as loader

        build = self.report.build
        loader.clear_campplus_cache()
        start = time.perf_counter_ns()
        model = loader.get_campplus_torch(onnx, device, seg_pool_mode=TORCH_SEG_POOL_MODE)
        build.torch_cold_build_ms = (time.perf_counter_ns() - start) / 1e6
        build.torch_backend_name = str(model.name)
        hits = []
        for _ in range(200):
            start = time.perf_counter_ns()
            again = loader.get_campplus_torch(onnx, device, seg_pool_mode=TORCH_SEG_POOL_MODE)
            hits.append(time.perf_counter_ns() - start)
        if again is not model:
            raise RuntimeError("get_campplus_torch returned a different object for the same file and device")
        build.torch_cache_hit_us = float(np.median(hits)) / 1e3
        return model

    def _measure_latency(self, runners: list[_Runner], inputs: dict[int, torch.Tensor], device: torch.device) -> None:
        from vllm_omni_token2wav import platforms

        cfg = self.config
        platform = platforms.current_omni_platform

        def sync() -> None:
            if device.type != "cpu":
                platform.synchronize(device)

        self.progress.start(sum(cfg.warmup + cfg.iters_at(t) for t in inputs) * len(runners))
        for frames, x in inputs.items():
            samples: dict[str, list[tuple[int, int, int]]] = {r.label: [] for r in runners}
            outputs: dict[str, torch.Tensor] = {}
            for runner in runners:
                runner.used.clear()
            try:
                for i in range(cfg.warmup + cfg.iters_at(frames)):
                    # Rotate the call order every iteration so no backend always runs first (or right after another).
                    shift = i % len(runners)
                    for runner in runners[shift:] + runners[:shift]:
                        out, host, cpu, wall = _timed_call(runner.run, x, sync)
                        if i == 0:
                            outputs[runner.label] = out
                        if i >= cfg.warmup:
                            samples[runner.label].append((host, cpu, wall))
                        time.sleep(CALL_GAP_S)
                    self.progress.advance(len(runners), f"T={frames}")
            finally:
                # Keep what this T measured even if the loop was interrupted half way.
                self._record(frames, runners, samples, outputs, device)

    def _record(
        self,
        frames: int,
        runners: list[_Runner],
        samples: dict[str, list[tuple[int, int, int]]],
        outputs: dict[str, torch.Tensor],
        device: torch.device,
    ) -> None:
        n = min(len(v) for v in samples.values())
        if n == 0:
            return
        tol = tolerances_for(device)
        for runner in runners:
            # The reference of a cell: onnxruntime at the same thread budget.
            ort_label = f"ort@{runner.threads}"
            ort = samples[ort_label][:n]
            ort_wall = LatencyStats.from_ns([s[2] for s in ort])
            rows = samples[runner.label][:n]
            cell = CellResult(
                backend=runner.key,
                backend_name=runner.name,
                frames=frames,
                batch=self.config.batch,
                threads=runner.threads,
                wall=LatencyStats.from_ns([s[2] for s in rows]),
                host=LatencyStats.from_ns([s[0] for s in rows]),
                host_cpu=LatencyStats.from_ns([s[1] for s in rows]),
            )
            if runner.used:
                timed = runner.used[self.config.warmup :][:n]
                cell.threads_used = {str(k): timed.count(k) for k in sorted(set(timed))}
            cell.ratio_vs_ort = cell.wall.median_ms / ort_wall.median_ms
            cell.paired_ratio_vs_ort = float(np.median([r[2] / max(o[2], 1) for r, o in zip(rows, ort, strict=True)]))
            if runner.key != "ort" and runner.label in outputs and ort_label in outputs:
                metrics = parity(outputs[runner.label], outputs[ort_label])
                cell.cosine_vs_ort, cell.max_abs_diff_vs_ort = metrics.cosine, metrics.max_abs_diff
                cell.rel_l2_diff_vs_ort, cell.ort_max_abs = metrics.rel_l2_diff, metrics.ref_max_abs
                cell.parity_ok = metrics.ok(tol)
            self.report.results.append(cell)

    def _measure_prompt_cache(self, onnx: Path, clip: np.ndarray, device: torch.device) -> None:
        self.progress.stage("prompt cache (StepAudio2Token2WavCore.prepare_prompt)")
        times = PromptCacheTimes(prompt_seconds=clip.size / SAMPLE_RATE)
        self.report.prompt_cache = times
        try:
            from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav import (
                StepAudio2Token2WavCore,
            )
        except ImportError as exc:
            times.unavailable = f"StepAudio2Token2WavCore is not importable ({exc})"
            return
        with tempfile.TemporaryDirectory(prefix="spk-bench-token2wav-") as tmp:
            # The core reads campplus.onnx from a token2wav directory; give it one holding just that file.
            link = Path(tmp) / "campplus.onnx"
            try:
                link.symlink_to(onnx)
            except OSError:
                import shutil

                shutil.copyfile(onnx, link)
            try:
                # The same intra-op threads as the measured onnxruntime session (the header's number).
                core = StepAudio2Token2WavCore(tmp, device=device, ort_intra_op_threads=max(self.config.threads))
                core.enable_device_spk_embedding()
                prompt = (clip, SAMPLE_RATE)
                start = time.perf_counter_ns()
                core.prepare_prompt(prompt)
                times.miss_ms = (time.perf_counter_ns() - start) / 1e6
                hits = []
                for _ in range(self.config.prompt_cache_iters):
                    start = time.perf_counter_ns()
                    core.prepare_prompt(prompt)
                    hits.append(time.perf_counter_ns() - start)
                times.hit = LatencyStats.from_ns(hits)
                times.backend = str(getattr(core, "spk_backend", None))
            except (OSError, RuntimeError, ValueError, NotImplementedError) as exc:
                # The prompt path may need assets a campplus-only directory lacks; say so instead of failing the run.
                times.unavailable = f"{type(exc).__name__}: {exc}"
                logger.warning("prompt-cache timing skipped: %s", times.unavailable)


def policy_choice(onnx: Path, device: torch.device, threads: int) -> PolicyChoice:
    """Ask the serving policy which backend it installs here (it builds nothing new: the torch model is
    cached from the measurement, an ORT choice stays lazy, a TensorRT engine is cached on disk)."""
    from vllm_omni_token2wav.model_executor.models.speaker_embedding import selection as speaker_embedding

    backend = speaker_embedding.select_speaker_embedding_backend(
        onnx, device, request="device", ort_intra_op_threads=threads, seg_pool_mode=TORCH_SEG_POOL_MODE
    )
    name = str(backend.name)
    key = "ort" if name.startswith("onnxruntime") else ("trt" if name.startswith("tensorrt") else "torch")
    if device.type == "cpu":
        rule = f"CPU_DEVICE_PATH_BACKEND = {speaker_embedding.CPU_DEVICE_PATH_BACKEND!r}"
    else:
        rule = f"the {device.type} device path"
    return PolicyChoice(device=str(device), backend_name=name, backend=key, rule=rule)


def _timed_call(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, sync: Callable[[], None]
) -> tuple[torch.Tensor, int, int, int]:
    """(output, host ns, calling-thread CPU ns, wall ns) of one call; see the module docstring."""
    cpu0 = time.thread_time_ns()
    t0 = time.perf_counter_ns()
    out = fn(x)
    t1 = time.perf_counter_ns()
    cpu1 = time.thread_time_ns()
    sync()
    t2 = time.perf_counter_ns()
    return out, t1 - t0, cpu1 - cpu0, t2 - t0


def _config_dict(config: BenchConfig) -> dict[str, Any]:
    data = asdict(config)
    data["onnx"] = None if config.onnx is None else str(config.onnx)
    data["audio"] = None if config.audio is None else str(config.audio)
    data["call_gap_ms"] = CALL_GAP_S * 1e3
    data["ratio_definition"] = (
        "median wall latency of the backend / median wall latency of onnxruntime, same T and thread budget"
    )
    return data
