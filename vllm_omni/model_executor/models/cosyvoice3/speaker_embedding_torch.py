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

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vllm_omni.file_identity import FileIdentity
from vllm_omni.logger import init_logger
from vllm_omni.model_executor.models.campplus.dtdnn import CAMPPlus
from vllm_omni.model_executor.models.campplus.inference import CampplusInference
from vllm_omni.model_executor.models.campplus.onnx_import import CampplusOnnxError, load_campplus_onnx
from vllm_omni.model_executor.models.campplus.segpool import check_seg_pool_mode, resolve_seg_pool_mode
from vllm_omni.platforms.device import DeviceSpec, device_key, normalize_device

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
MIN_FRAMES = 4  # stats pooling needs T' = ceil(T/2) >= 2; upstream TensorRT profiles start at 4
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
    """

    def __init__(self, model: CAMPPlus, device: DeviceSpec = None, *, fast: bool = True) -> None:
        self.device: torch.device = normalize_device(device)
        self.name = f"torch-{device_key(self.device)}"
        self.seg_pool_mode = model.seg_pool_mode
        self.embedding_size = model.embedding_size
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
        x = self._prepare(feat)
        with torch.inference_mode():
            return self._impl(x.unsqueeze(0))

    def embed_batch(self, feats: Sequence[torch.Tensor | np.ndarray]) -> torch.Tensor:
        """Embed several utterances; row i equals `self(feats[i])[0]`.

        Utterances run batched per distinct length and never padded: zero padding would enter the
        convolutions' receptive fields, the utterance mean and the segment means, and change results.
        """
        if len(feats) == 0:
            raise ValueError("embed_batch needs at least one feature tensor, got an empty list")
        prepared = []
        for i, feat in enumerate(feats):
            try:
                prepared.append(self._prepare(feat))
            except ValueError as exc:
                raise ValueError(f"embed_batch item {i}: {exc}") from None
        out = torch.empty((len(prepared), self.embedding_size), dtype=torch.float32, device=self.device)
        groups: dict[int, list[int]] = {}
        for i, x in enumerate(prepared):
            groups.setdefault(x.shape[0], []).append(i)
        with torch.inference_mode():
            for indices in groups.values():
                batch = torch.stack([prepared[i] for i in indices])
                out[torch.tensor(indices, device=self.device)] = self._impl(batch)
        return out

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
    rebuilt; see `vllm_omni.file_identity` for the ~45 ms the hash costs per call), the device
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
            "built CAM++ %s from %s (%s seg-pool) in %.0f ms",
            backend.name,
            key.path,
            key.seg_pool_mode,
            (time.perf_counter() - start) * 1e3,
        )
        return backend


def clear_campplus_cache() -> None:
    """Forget every cached `CampplusTorch` (tests; or to release device memory)."""
    with _cache_lock:
        _cache.clear()
        _build_locks.clear()
