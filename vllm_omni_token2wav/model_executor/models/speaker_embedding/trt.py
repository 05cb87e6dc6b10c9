# SPDX-License-Identifier: Apache-2.0
"""CAM++ as a TensorRT engine on CUDA, with an on-disk engine cache.

On CUDA hosts with TensorRT, upstream swaps the CPU onnxruntime session (~50 ms per call) for an
engine built from the same campplus.onnx (~3.6 ms). Building an engine takes tens of seconds, so
engines are cached under `vllm_omni_token2wav.envs.cache_dir("tensorrt")`, keyed by the ONNX file's identity
(absolute path, size, mtime and content SHA-256, `vllm_omni_token2wav.file_identity`), the GPU name and the
TensorRT version: a new or rewritten file, a different GPU or a TensorRT upgrade each get a fresh
engine. Engines are written atomically (tmp file + `os.replace`) and built under one lock per engine,
so concurrent facades build each engine once.

`tensorrt` is imported lazily, only when this backend is built. The selection logic and the cache
logic are exercised on CPU with fakes; the engine itself only runs on an NVIDIA GPU.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import torch

from vllm_omni_token2wav import envs
from vllm_omni_token2wav.atomic_io import write_bytes_atomic
from vllm_omni_token2wav.file_identity import FileIdentity
from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

EMBEDDING_DIM: Final = 192
FEAT_DIM: Final = 80
# Optimisation profile over the frame axis (min, opt, max) of the fbank input [1, T, 80], as
# upstream: T >= 4 keeps CAM++'s statistics pooling defined; 3000 frames = 30 s of prompt audio.
PROFILE_FRAMES: Final = (4, 500, 3000)

# Process-wide: two facades on the same campplus.onnx and GPU share one engine file, so the lock
# that serialises its build must be shared too. Guarded by `_ENGINE_LOCKS_GUARD`.
_ENGINE_LOCKS_GUARD = threading.Lock()
_ENGINE_LOCKS: dict[str, threading.Lock] = {}


def tensorrt_unavailable_reason() -> str | None:
    """None when the `tensorrt` Python package can be found, else why not (without importing it)."""
    try:
        spec = importlib.util.find_spec("tensorrt")
    except (ImportError, ValueError) as exc:
        return f"the tensorrt package cannot be located ({exc})"
    return None if spec is not None else "the tensorrt package is not installed"


@dataclass(frozen=True)
class EngineCacheKey:
    """Everything a cached engine depends on; `digest` names the engine file."""

    onnx_path: str
    onnx_size: int
    onnx_mtime_ns: int
    gpu_name: str
    tensorrt_version: str
    profile_frames: tuple[int, int, int] = PROFILE_FRAMES
    onnx_sha256: str = ""

    @classmethod
    def for_file(cls, onnx_path: str | Path, *, gpu_name: str, tensorrt_version: str) -> EngineCacheKey:
        path = Path(onnx_path)
        try:
            file = FileIdentity.of(path)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"speaker model {path} does not exist; the token2wav directory needs campplus.onnx"
            ) from None
        return cls(file.path, file.size, file.mtime_ns, gpu_name, tensorrt_version, onnx_sha256=file.sha256)

    @property
    def digest(self) -> str:
        text = "\n".join(
            [
                self.onnx_path,
                str(self.onnx_size),
                str(self.onnx_mtime_ns),
                self.onnx_sha256,
                self.gpu_name,
                self.tensorrt_version,
                ",".join(map(str, self.profile_frames)),
            ]
        )
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def engine_path(self, cache_root: Path | None = None) -> Path:
        root = cache_root if cache_root is not None else envs.cache_dir("tensorrt")
        return root / f"campplus-{self.digest}.plan"


def _engine_lock(path: Path) -> threading.Lock:
    with _ENGINE_LOCKS_GUARD:
        return _ENGINE_LOCKS.setdefault(str(path), threading.Lock())


def load_or_build_engine(engine_path: Path, build: Callable[[], bytes]) -> bytes:
    """The serialized engine at `engine_path`, building and caching it with `build()` when absent.

    One lock per engine path: concurrent callers for the same engine wait for one build; callers for
    other engines are not blocked. The file appears atomically, so another process either sees no
    engine (and builds its own) or a complete one.
    """
    with _engine_lock(engine_path):
        if engine_path.is_file():
            return engine_path.read_bytes()
        start = time.perf_counter()
        data = build()
        if not data:
            raise RuntimeError(f"TensorRT returned an empty engine for {engine_path.name}")
        write_bytes_atomic(engine_path, data)
        logger.info("built TensorRT engine %s in %.1f s", engine_path, time.perf_counter() - start)
        return data


def _build_serialized_engine(trt: Any, onnx_path: Path) -> bytes:
    """Parse `onnx_path` and build an fp32 engine with the `PROFILE_FRAMES` profile."""
    trt_logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(trt_logger)
    flag = getattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH", None)
    network = builder.create_network(0 if flag is None else 1 << int(flag))
    parser = trt.OnnxParser(network, trt_logger)
    if not parser.parse(onnx_path.read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"{onnx_path}: TensorRT cannot parse the speaker model: {errors}")
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    lo, opt, hi = PROFILE_FRAMES
    profile.set_shape(network.get_input(0).name, (1, lo, FEAT_DIM), (1, opt, FEAT_DIM), (1, hi, FEAT_DIM))
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError(f"{onnx_path}: TensorRT failed to build an engine (see the TensorRT log above)")
    return bytes(serialized)


def _checked_engine(trt: Any, onnx_path: Path) -> bytes:
    """An engine for `onnx_path` after the structural check every backend runs (TensorRT, like onnxruntime,
    would build any network whose shapes fit)."""
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.onnx_import import check_campplus_export

    check_campplus_export(onnx_path, feat_dim=FEAT_DIM, embedding_size=EMBEDDING_DIM)
    return _build_serialized_engine(trt, onnx_path)


class TrtSpeakerEmbedding:
    """`SpeakerEmbeddingBackend` running a cached TensorRT engine of `campplus.onnx` on `device`.

    The engine is loaded (or built and cached) in the constructor, so an explicit request fails
    where it is made. Calls run on the device's current stream; one execution context serves all
    threads under a lock (contexts are not thread-safe).
    """

    def __init__(self, onnx_path: str | Path, device: torch.device) -> None:
        if device.type != "cuda":
            raise RuntimeError(f"TensorRT speaker embedding needs a CUDA device, got {device}")
        from vllm_omni_token2wav import platforms
        from vllm_omni_token2wav.model_executor.models.speaker_embedding.backend import check_speaker_model_path

        check_speaker_model_path(Path(onnx_path))
        self.onnx_path = Path(onnx_path)
        self._device = device
        trt = importlib.import_module("tensorrt")
        platform = platforms.current_omni_platform
        key = EngineCacheKey.for_file(
            self.onnx_path,
            gpu_name=platform.get_device_name(device.index),
            tensorrt_version=str(getattr(trt, "__version__", "unknown")),
        )
        self.engine_path = key.engine_path()
        data = load_or_build_engine(self.engine_path, lambda: _checked_engine(trt, self.onnx_path))
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        engine = runtime.deserialize_cuda_engine(data)
        if engine is None:
            raise RuntimeError(
                f"{self.engine_path}: TensorRT cannot deserialize the cached engine; delete the file to rebuild it"
            )
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if n not in inputs]
        if len(inputs) != 1 or len(outputs) != 1:
            raise ValueError(f"{self.onnx_path}: expected one input and one output, got {inputs} / {outputs}")
        self._engine = engine
        self._context = engine.create_execution_context()
        self._input_name, self._output_name = inputs[0], outputs[0]
        self._platform = platform
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return f"tensorrt-{self._device}"

    @property
    def device(self) -> torch.device:
        return self._device

    def __call__(self, feat: torch.Tensor) -> torch.Tensor:
        from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import (
            validate_speaker_features,
        )

        validate_speaker_features(feat)
        frames = int(feat.shape[0])
        lo, _, hi = PROFILE_FRAMES
        if not lo <= frames <= hi:
            raise ValueError(
                f"speaker features have {frames} frames; the TensorRT engine accepts {lo}..{hi} "
                f"(0.04-30 s of 16 kHz audio)"
            )
        x = feat.detach().to(device=self._device, dtype=torch.float32).contiguous().unsqueeze(0)
        out = torch.empty((1, EMBEDDING_DIM), dtype=torch.float32, device=self._device)
        stream = self._platform.device_module().current_stream(self._device)
        with self._lock:
            self._context.set_input_shape(self._input_name, tuple(x.shape))
            self._context.set_tensor_address(self._input_name, x.data_ptr())
            self._context.set_tensor_address(self._output_name, out.data_ptr())
            if not self._context.execute_async_v3(stream.cuda_stream):
                raise RuntimeError(f"TensorRT execution of {self.engine_path.name} failed")
        return out

    def __repr__(self) -> str:
        return f"TrtSpeakerEmbedding({str(self.onnx_path)!r}, device={self._device}, engine={self.engine_path.name})"
