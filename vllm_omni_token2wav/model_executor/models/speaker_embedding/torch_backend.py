# SPDX-License-Identifier: Apache-2.0
"""Run the CAM++ speaker embedding on the serving device, from the shipped campplus.onnx.

Upstream runs `campplus.onnx` in a CPU onnxruntime session on every request, which blocks the
host for 120-155 ms per call on Ascend hosts. This module loads the same weights into the in-tree
`CAMPPlus` (`load_campplus_from_onnx`, strict tensor-by-tensor mapping, see
`campplus.onnx_import`) and serves it with the folded eval form (`campplus.inference`) on any
torch device, so the embedding runs where the rest of the stage runs.

Seg-pool default `"legacy"`: the flow models consuming the embedding were trained on embeddings
from onnxruntime 1.18, whose AveragePool divides the last partial 100-frame segment by 100. Use
`"auto"` to agree with whatever onnxruntime this process has (1.29+ is `"exact"`), e.g. when
mixing this backend with an onnxruntime fallback. See `campplus.segpool`.

Tolerances (stand-in weights, CPU, fp32): max |torch - onnxruntime| <= 1e-4 and cosine >= 0.999999
on the raw 192-d output; on accelerators vs the CPU session max abs <= 1e-3, cosine >= 0.9999.
Not tighter on CPU because onnxruntime itself is up to 1.7e-5 from a float64 evaluation of the same
weights (docs/design/speaker_embedding.md, "Tolerances").
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vllm_omni_token2wav.file_identity import FileIdentity
from vllm_omni_token2wav.known_files import identify_file
from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.buckets import batch_buckets, campplus_frame_buckets
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.batching import Launch, plan_launches
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.dtdnn import CAMPPlus
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.inference import CampplusInference
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.masking import MIN_FRAMES, check_lengths
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.onnx_import import (
    CampplusOnnxError,
    load_campplus_onnx,
)
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.segpool import (
    check_seg_pool_mode,
    resolve_seg_pool_mode,
)
from vllm_omni_token2wav.platforms.cpu.threads import call_threads, intra_op_threads
from vllm_omni_token2wav.platforms.device import DeviceSpec, device_key, normalize_device

logger = init_logger(__name__)

__all__ = [
    "CampplusOnnxError",
    "CampplusTorch",
    "FEAT_DIM",
    "MIN_FRAMES",
    "clear_campplus_cache",
    "get_campplus_torch",
    "load_campplus_from_onnx",
    "validate_speaker_features",
]

FEAT_DIM = 80
DEFAULT_SEG_POOL_MODE = "legacy"


def load_campplus_from_onnx(path: str | os.PathLike[str], *, seg_pool_mode: str = DEFAULT_SEG_POOL_MODE) -> CAMPPlus:
    """Eval-mode fp32 CPU `CAMPPlus` holding exactly the tensors of `path`; raises `CampplusOnnxError`."""
    return load_campplus_onnx(path, seg_pool_mode=seg_pool_mode)


def validate_speaker_features(feat: object) -> None:
    """Check one utterance's features: float [T, 80], T >= 4, finite (host values only); else a ValueError."""
    if not isinstance(feat, torch.Tensor | np.ndarray):
        raise ValueError(f"speaker features must be a torch.Tensor or numpy array [T, {FEAT_DIM}], got {type(feat)}")
    shape = tuple(feat.shape)
    if len(shape) != 2:
        raise ValueError(
            f"speaker features must have shape [T, {FEAT_DIM}] (one utterance, time-major), got {list(shape)}"
            + ("; drop the batch dim (feat[0])" if len(shape) == 3 and shape[0] == 1 else "")
        )
    if shape[1] != FEAT_DIM:
        raise ValueError(
            f"speaker features must have {FEAT_DIM} mel bins in the last dim, got shape {list(feat.shape)}; "
            "expected Kaldi fbank with num_mel_bins=80 (time-major [T, 80])"
        )
    if shape[0] < MIN_FRAMES:
        raise ValueError(
            f"speaker features need T >= {MIN_FRAMES} frames (about 60 ms of 16 kHz audio), got T={shape[0]}"
        )
    is_float = feat.dtype.is_floating_point if isinstance(feat, torch.Tensor) else feat.dtype.kind == "f"
    if not is_float:
        raise ValueError(f"speaker features must be a float tensor, got dtype {feat.dtype}")
    # Values only where reading them costs no device round trip (numpy, CPU tensors). Features on an
    # accelerator come from `audio.speaker_features` of a waveform the host front end checked
    # (`audio.loading` rejects NaN / Inf), and Kaldi fbank of finite audio is finite (log of a floored
    # energy); reading `isfinite(...).all()` back would stall every CAM++ call on the device.
    if isinstance(feat, np.ndarray):
        finite = bool(np.isfinite(feat).all())
    else:
        finite = feat.device.type != "cpu" or bool(torch.isfinite(feat).all())
    if not finite:
        raise ValueError("speaker features contain NaN or Inf; check the waveform (silence/clipping) and the fbank")


class CampplusTorch:
    """CAM++ on a torch device: `__call__(feat [T, 80]) -> [1, E]`, `embed_batch([[T_i, 80]]) -> [B, E]`.

    fp32 on `device`, under `inference_mode`. `fast=False` serves the reference `CAMPPlus.forward`
    instead of the folded form (for debugging numerics).

    Entry points, from one utterance to captured graphs:
    - `__call__(feat)`: one utterance at its exact length (no padding work);
    - `embed_batch(feats)`: many utterances, padded to the shared frame buckets (and, off the CPU,
      batch buckets) by `campplus.batching.plan_launches`; row i equals `self(feats[i])` (bit for
      bit on CPU);
    - `embed_padded(x, lengths)`: one padded launch [B, T, 80] + lengths [B] on the device, static
      shapes, no host synchronisation: what a CUDA / NPU graph captures per (frame, batch) bucket.

    CPU threads: a call's budget is the calling thread's torch intra-op thread count; with
    `adaptive_threads` (default) each call uses only the cores no other runnable thread holds at
    that moment (`platforms.cpu.threads.call_threads`), because torch's statically split OpenMP
    regions stall (3-30x measured) when a core is taken. `last_call_threads` says what the last call used.
    """

    def __init__(
        self, model: CAMPPlus, device: DeviceSpec = None, *, fast: bool = True, adaptive_threads: bool = True
    ) -> None:
        self.device: torch.device = normalize_device(device)
        self.name = f"torch-{device_key(self.device)}"
        self.seg_pool_mode = model.seg_pool_mode
        self.embedding_size = model.embedding_size
        self.adaptive_threads = adaptive_threads
        self.last_call_threads: int | None = None  # diagnostics: intra-op threads of the last CPU call
        model = model.eval()
        if fast:
            self._impl = CampplusInference(model, self.device)
            self._model: CAMPPlus | None = None
        else:
            self._model = model.to(self.device)
            self._impl = self._model  # type: ignore[assignment]

    def _prepare(self, feat: torch.Tensor | np.ndarray) -> torch.Tensor:
        validate_speaker_features(feat)
        x = torch.from_numpy(np.asarray(feat)) if isinstance(feat, np.ndarray) else feat
        return x.to(device=self.device, dtype=torch.float32)

    def __call__(self, feat: torch.Tensor | np.ndarray) -> torch.Tensor:
        # Threads first: the input checks run parallel ops, whose woken OpenMP workers would
        # otherwise count as other runnable threads in the sample (`_threads`).
        with self._threads():
            x = self._prepare(feat)
            with torch.inference_mode():
                return self._impl(x.unsqueeze(0))

    @contextlib.contextmanager
    def _threads(self) -> Iterator[None]:
        """On CPU, run the block with the threads the host can give now (see the class docstring)."""
        if self.device.type != "cpu":
            yield
            return
        budget = torch.get_num_threads()
        threads = call_threads(budget) if self.adaptive_threads else budget
        self.last_call_threads = threads
        with intra_op_threads(threads):
            yield

    def embed_padded(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Embed one padded launch: `x` [B, T, 80] fp32 on `device`, `lengths` [B] valid frames -> [B, E].

        Frames at and beyond `lengths[b]` of row b are ignored exactly (`campplus.masking`). Shapes
        are checked; the values of `lengths` only when it is a CPU tensor (reading a device tensor
        would synchronise). Nothing here reads device memory on the host, so the call can be captured.
        """
        if x.dim() != 3 or x.shape[-1] != FEAT_DIM or x.dtype != torch.float32 or x.device != self.device:
            raise ValueError(
                f"embed_padded needs float32 features [B, T, {FEAT_DIM}] on {self.device}, got "
                f"{x.dtype} {list(x.shape)} on {x.device}"
            )
        check_lengths(lengths, x.shape[1], x.shape[0])
        with self._threads(), torch.inference_mode():
            return self._impl(x, lengths.to(self.device, non_blocking=True))

    def embed_batch(self, feats: Sequence[torch.Tensor | np.ndarray]) -> torch.Tensor:
        """Embed several utterances; row i equals `self(feats[i])[0]` (to the last bit on CPU).

        Utterances are padded to the shared frame buckets (`buckets.campplus_frame_buckets()`) and
        launched together per bucket; off the CPU the row count is padded to a batch bucket too
        (`buckets.batch_buckets()`), the shapes graph capture is keyed by. See `campplus.batching`.
        """
        if len(feats) == 0:
            raise ValueError("embed_batch needs at least one feature tensor, got an empty list")
        with self._threads():  # before the input checks' parallel ops (see `__call__`)
            prepared = []
            for i, feat in enumerate(feats):
                try:
                    prepared.append(self._prepare(feat))
                except ValueError as exc:
                    raise ValueError(f"embed_batch item {i}: {exc}") from None
            return self._embed_prepared(prepared)

    @property
    def pads_rows(self) -> bool:
        """Whether launches pad their row count to a batch bucket (off the CPU: the shapes graphs are keyed by)."""
        return self.device.type != "cpu"

    def plan(self, lengths: Sequence[int]) -> list[Launch]:
        """The padded launches `embed_batch` makes for utterances of `lengths` frames (`campplus.batching`)."""
        return plan_launches(lengths, campplus_frame_buckets(), batch_buckets(), pad_rows=self.pads_rows)

    def _embed_prepared(self, prepared: list[torch.Tensor]) -> torch.Tensor:
        """`embed_batch` on features already validated and on the device, inside the caller's `_threads()`
        (one choice for all launches: back-to-back launches would see their own spinning workers)."""
        plan = self.plan([x.shape[0] for x in prepared])
        out = torch.empty((len(prepared), self.embedding_size), dtype=torch.float32, device=self.device)
        for launch in plan:
            x, lengths = self._launch_inputs(launch, prepared)
            with torch.inference_mode():
                embeddings = self._impl(x, lengths)
            self._scatter(out, launch.indices, embeddings[: len(launch.indices)])
        return out

    def _scatter(self, out: torch.Tensor, indices: tuple[int, ...], rows: torch.Tensor) -> None:
        """`out[indices] = rows` without waiting for the device: a slice when the indices are consecutive
        (one utterance, or a group in request order), else an index copied to the device non-blocking
        (`torch.tensor(indices, device=d)` would be a blocking pageable copy)."""
        first = indices[0]
        if indices == tuple(range(first, first + len(indices))):
            out[first : first + len(indices)] = rows
            return
        index = torch.tensor(indices, dtype=torch.int64).to(self.device, non_blocking=True)
        out.index_copy_(0, index, rows)

    def _launch_inputs(self, launch: Launch, prepared: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The padded features [rows, frames, 80] and lengths [rows] (both on the device) of one launch."""
        x = torch.zeros((launch.rows, launch.frames, FEAT_DIM), dtype=torch.float32, device=self.device)
        # Dummy rows (batch-bucket padding) are all-zero utterances of full length, then dropped.
        lengths = torch.full((launch.rows,), launch.frames, dtype=torch.int64)
        for row, index in enumerate(launch.indices):
            frames = prepared[index].shape[0]
            x[row, :frames] = prepared[index]
            lengths[row] = frames
        check_lengths(lengths, launch.frames, launch.rows)  # values: on the host, before the launch
        return x, lengths.to(self.device, non_blocking=True)

    def __repr__(self) -> str:
        return f"CampplusTorch(name={self.name!r}, seg_pool_mode={self.seg_pool_mode!r})"


@dataclass(frozen=True)
class _CacheKey:
    file: FileIdentity
    device: str
    seg_pool_mode: str

    @property
    def path(self) -> str:
        return self.file.path


# Process-wide: every stage and request of a process shares one built model per (file, device,
# mode); building costs seconds and the weights are read-only. `_cache_lock` guards both dicts;
# the per-key lock makes concurrent first callers wait for a single build.
_cache_lock = threading.Lock()
_cache: dict[_CacheKey, CampplusTorch] = {}
_build_locks: dict[_CacheKey, threading.Lock] = {}


def _cache_key(onnx_path: str | os.PathLike[str], device: DeviceSpec, seg_pool_mode: str) -> _CacheKey:
    try:
        file = FileIdentity.of(onnx_path)
    except FileNotFoundError:
        raise CampplusOnnxError(f"campplus.onnx not found: {Path(onnx_path).expanduser().resolve()}") from None
    except IsADirectoryError:
        raise CampplusOnnxError(f"campplus.onnx path is not a file: {Path(onnx_path).expanduser()}") from None
    return _CacheKey(file, device_key(device), resolve_seg_pool_mode(seg_pool_mode))


def get_campplus_torch(
    onnx_path: str | os.PathLike[str], device: DeviceSpec = None, *, seg_pool_mode: str = DEFAULT_SEG_POOL_MODE
) -> CampplusTorch:
    """The process's `CampplusTorch` for this file on `device` (None = the serving device), built once.

    Keyed on the resolved path, the file's identity (size, mtime_ns, inode and the SHA-256 of its
    content: a file changed on disk, even in place with the same size and its mtime put back, is
    rebuilt; see `vllm_omni_token2wav.file_identity` for the ~45 ms the hash costs per call), the device
    normalised to an explicit index ("npu", "npu:0", torch.device("npu", 0) share an entry) and the
    resolved seg-pool mode. A rebuild for a changed file drops the entry of its previous version
    (holders of the old model keep it). Thread-safe: concurrent callers share one build.
    """
    check_seg_pool_mode(seg_pool_mode)
    key = _cache_key(onnx_path, device, seg_pool_mode)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            return hit
        build_lock = _build_locks.setdefault(key, threading.Lock())
    with build_lock:
        with _cache_lock:
            hit = _cache.get(key)
        if hit is not None:
            return hit
        start = time.perf_counter()
        model = load_campplus_from_onnx(key.path, seg_pool_mode=key.seg_pool_mode)
        backend = CampplusTorch(model, key.device)
        with _cache_lock:
            same_slot = (key.path, key.device, key.seg_pool_mode)
            for stale in [k for k in _cache if (k.path, k.device, k.seg_pool_mode) == same_slot and k != key]:
                del _cache[stale]  # a previous version of the same file: nobody gets it from here again
            _cache[key] = backend
            _build_locks.pop(key, None)
        logger.info(
            "built CAM++ %s from %s, %s (%s seg-pool) in %.0f ms",
            backend.name,
            key.path,
            identify_file(key.path).describe(),
            key.seg_pool_mode,
            (time.perf_counter() - start) * 1e3,
        )
        return backend


def clear_campplus_cache() -> None:
    """Forget every cached `CampplusTorch` (tests; or to release device memory)."""
    with _cache_lock:
        _cache.clear()
        _build_locks.clear()
