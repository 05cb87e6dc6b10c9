# SPDX-License-Identifier: Apache-2.0
"""The Step-Audio2 Token2Wav core: a lazy facade over a token2wav asset directory.

A Token2Wav request brings a reference voice; its speaker embedding and prompt features must be
computed once, on the right device, without the facade building anything it does not need.
Upstream built a CPU onnxruntime session for CAM++ whenever the models were loaded, even on hosts
that then ran the embedding on the NPU. This core keeps every part lazy and lets the platform
glue install the speaker-embedding backend before anything is built:

| moment                               | what exists afterwards                                             |
|--------------------------------------|--------------------------------------------------------------------|
| `__init__`                           | configuration only (paths, flags); no file is opened               |
| `enable_device_spk_embedding()`      | the device backend (torch CAM++ / TensorRT engine), nothing else   |
| `enable_trt_spk_embedding()`         | the TensorRT backend (CUDA only), nothing else                     |
| `spk_model` (first access)           | the installed backend, or the ORT fallback object (no session yet) |
| first embedding on the ORT fallback  | the onnxruntime CPU session, built once                            |
| `_ensure_models_loaded()`            | assets checked, fallback installed if none; never replaces one     |

The synthesis modules (speech tokenizer, flow, HiFT) are not part of this core yet: they come with
the synthesis issue and will be loaded by `_ensure_models_loaded()`. Until then the facade offers
the prompt path only (`prepare_prompt`, `speaker_embedding`), and no synthesis method.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch

from vllm_omni.logger import init_logger
from vllm_omni.model_executor.models.cosyvoice3.speaker_embedding import (
    SpeakerEmbeddingBackend,
    select_speaker_embedding_backend,
)
from vllm_omni.model_executor.models.step_audio2.prompt_cache import CacheStats, ContentLruCache
from vllm_omni.model_executor.models.step_audio2.prompt_features import (
    EMBEDDING_DIM,
    PROMPT_MEL_RATE,
    SPEAKER_RATE,
    PromptFeatures,
    waveform_digest,
)
from vllm_omni.platforms import DeviceSpec, normalize_device

if TYPE_CHECKING:
    from vllm_omni.model_executor.models.audio import PromptAudio

logger = init_logger(__name__)

PromptWav = str | Path | bytes | tuple[np.ndarray | torch.Tensor, int]
DEFAULT_PROMPT_CACHE_SIZE = 16


@dataclass(frozen=True)
class Token2WavAssets:
    """File names inside a token2wav directory (`None`: the family does not ship that file)."""

    speaker_model: str = "campplus.onnx"
    speech_tokenizer: str = "speech_tokenizer_v2_25hz.onnx"
    flow_config: str | None = "flow.yaml"
    flow: str = "flow.pt"
    hift: str = "hift.pt"


STEP_AUDIO2_ASSETS = Token2WavAssets()


class StepAudio2Token2WavCore:
    """Prompt path of Step-Audio2's token2wav over `model_path` (see the module table for laziness).

    Args:
        model_path: token2wav directory (`campplus.onnx`, `speech_tokenizer_v2_25hz.onnx`,
            `flow.yaml`, `flow.pt`, `hift.pt`).
        float16: run the flow model in fp16 once synthesis lands (the speaker path is always fp32).
        device: serving device; None means the platform's serving device (resolved on first use).
        n_timesteps: flow-matching Euler steps for synthesis (recorded for the synthesis issue).
        prompt_cache_size: entries of the prompt-feature LRU (0 disables storing).
        ort_intra_op_threads: intra-op threads of the ORT fallback session (upstream: 1).
        spk_seg_pool_mode: CAM++ segment-pooling numerics of the torch device path: `"legacy"`
            (onnxruntime <= 1.28, what the flow models were trained on) or `"auto"` (agree with the
            installed onnxruntime, i.e. with the ORT fallback). See `campplus.segpool`.
    """

    assets: ClassVar[Token2WavAssets] = STEP_AUDIO2_ASSETS

    def __init__(
        self,
        model_path: str | Path,
        *,
        float16: bool = False,
        device: DeviceSpec = None,
        n_timesteps: int = 10,
        prompt_cache_size: int = DEFAULT_PROMPT_CACHE_SIZE,
        ort_intra_op_threads: int = 1,
        spk_seg_pool_mode: str = "legacy",
    ) -> None:
        if isinstance(n_timesteps, bool) or not isinstance(n_timesteps, int) or n_timesteps < 1:
            raise ValueError(f"n_timesteps must be an int >= 1, got {n_timesteps!r}")
        self.model_path = Path(model_path)
        self.float16 = bool(float16)
        self.n_timesteps = n_timesteps
        self.ort_intra_op_threads = ort_intra_op_threads
        from vllm_omni.model_executor.models.campplus.segpool import check_seg_pool_mode

        self.spk_seg_pool_mode = check_seg_pool_mode(spk_seg_pool_mode)
        self._device_spec = device
        self._device: torch.device | None = None
        # One re-entrant lock for the facade's lazy state: device resolution, backend install, loading.
        self._lock = threading.RLock()
        self._spk: SpeakerEmbeddingBackend | None = None
        self._models_loaded = False
        self._prompt_cache: ContentLruCache[PromptFeatures] = ContentLruCache(prompt_cache_size, PromptFeatures.clone)

    # ---- configuration ---------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        """The facade's device (explicit, else the platform's serving device), resolved once."""
        device = self._device
        if device is None:
            with self._lock:
                if self._device is None:
                    self._device = normalize_device(self._device_spec)
                device = self._device
        return device

    def asset_path(self, name: str | None) -> Path:
        """`model_path / name`, raising FileNotFoundError that names the missing file or directory."""
        if name is None:
            raise ValueError(f"{type(self).__name__}: this token2wav layout has no such asset")
        if not self.model_path.is_dir():
            raise FileNotFoundError(
                f"token2wav directory {self.model_path} does not exist (or is not a directory); "
                f"expected it to hold {name}"
            )
        path = self.model_path / name
        if not path.is_file():
            present = sorted(p.name for p in self.model_path.iterdir())
            raise FileNotFoundError(
                f"{path} is missing: the token2wav directory {self.model_path} has {present or 'no files'}"
            )
        return path

    # ---- speaker-embedding backend -----------------------------------------------------------

    @property
    def spk_backend(self) -> str:
        """Name of the backend that computes embeddings (the ORT fallback until another is installed)."""
        backend = self._spk
        return backend.name if backend is not None else "onnxruntime-cpu"

    @property
    def spk_model(self) -> SpeakerEmbeddingBackend:
        """The installed speaker-embedding backend; installs the lazy ORT fallback when there is none.

        Never loads the synthesis modules and never builds the ORT session (its first call does).
        """
        backend = self._spk
        if backend is None:
            with self._lock:
                if self._spk is None:
                    self._spk = self._build_backend("fallback")
                backend = self._spk
        return backend

    def install_spk_backend(self, backend: SpeakerEmbeddingBackend) -> None:
        """Install any `SpeakerEmbeddingBackend`, replacing the current one (the prompt cache keys on its name)."""
        if not callable(backend) or not hasattr(backend, "name") or not hasattr(backend, "device"):
            raise TypeError(f"{backend!r} is not a SpeakerEmbeddingBackend (needs __call__, name and device)")
        with self._lock:
            self._spk = backend
        logger.info("%s: speaker embedding via %s", type(self).__name__, backend.name)

    def enable_device_spk_embedding(self) -> str:
        """Install the device speaker-embedding path for this facade's device; returns its name.

        NPU -> torch CAM++ on the NPU; CUDA -> TensorRT when importable, else torch; CPU -> the
        recorded faster backend (`CPU_DEVICE_PATH_BACKEND`). See `select_speaker_embedding_backend`.
        Builds neither the synthesis modules nor the ORT session; raises if the path cannot be built.
        """
        backend = self._build_backend("device")
        self.install_spk_backend(backend)
        return backend.name

    def enable_trt_spk_embedding(self) -> str:
        """Install the TensorRT backend (CUDA with `tensorrt` only; raises otherwise); returns its name."""
        backend = self._build_backend("tensorrt")
        self.install_spk_backend(backend)
        return backend.name

    def _build_backend(self, request: str) -> SpeakerEmbeddingBackend:
        onnx_path = self.asset_path(self.assets.speaker_model)
        return select_speaker_embedding_backend(
            onnx_path,
            self.device,
            request=request,  # type: ignore[arg-type]
            ort_intra_op_threads=self.ort_intra_op_threads,
            seg_pool_mode=self.spk_seg_pool_mode,
        )

    def _ensure_models_loaded(self) -> None:
        """Idempotently load what synthesis needs; today that is the speaker model only.

        Checks that the speaker model exists and installs the lazy ORT fallback if no backend is
        installed; an installed backend is never replaced, and the ORT session is not built here.
        The synthesis issue extends this with the speech tokenizer, flow and HiFT.
        """
        if self._models_loaded:
            return
        with self._lock:
            if self._models_loaded:
                return
            self.asset_path(self.assets.speaker_model)
            if self._spk is None:
                self._spk = self._build_backend("fallback")
            self._models_loaded = True

    def _forward_spk_embedding(self, feat: torch.Tensor) -> torch.Tensor:
        """Embedding `[1, 192]` float32 on the facade's device for fbank features `[T, 80]`."""
        return self._embed(self.spk_model, feat)

    def _embed(self, backend: SpeakerEmbeddingBackend, feat: torch.Tensor) -> torch.Tensor:
        emb = backend(feat)
        if tuple(emb.shape) != (1, EMBEDDING_DIM):
            raise ValueError(
                f"speaker backend {backend.name} returned an embedding of shape {list(emb.shape)}, "
                f"expected [1, {EMBEDDING_DIM}]"
            )
        return emb.to(device=self.device, dtype=torch.float32)

    # ---- prompt path -------------------------------------------------------------------------

    def prepare_prompt(self, prompt_wav: PromptWav) -> PromptFeatures:
        """Speaker embedding and 24 kHz prompt mel of `prompt_wav`, cached by content.

        `prompt_wav` is a path, encoded audio bytes, or `(waveform, sample_rate)` (mono or
        channels-first, float in [-1, 1] or integer PCM). Errors of the audio front end (missing
        file, undecodable bytes, empty or too long audio) surface unchanged. The returned features
        are the caller's own copy.
        """
        backend = self.spk_model
        digest, load = _prompt_source(prompt_wav)
        key = (digest, backend.name)
        return self._prompt_cache.get_or_compute(key, lambda: self._compute_prompt(load(), digest, backend))

    def speaker_embedding(self, prompt_wav: PromptWav) -> torch.Tensor:
        """`prepare_prompt(prompt_wav).speaker_embedding` (`[1, 192]` float32 on the facade's device)."""
        return self.prepare_prompt(prompt_wav).speaker_embedding

    @property
    def prompt_cache_stats(self) -> CacheStats:
        return self._prompt_cache.stats

    def clear_prompt_cache(self) -> None:
        self._prompt_cache.clear()

    def _compute_prompt(self, audio: PromptAudio, digest: str, backend: SpeakerEmbeddingBackend) -> PromptFeatures:
        from vllm_omni.model_executor.models import audio as frontend

        device = self.device
        wav_16k = torch.as_tensor(audio.wav_16k, dtype=torch.float32).to(device)
        wav_24k = torch.as_tensor(audio.wav_24k, dtype=torch.float32).to(device)
        feat = frontend.speaker_features(wav_16k)
        if not isinstance(feat, torch.Tensor):  # only batched calls with lengths return a tuple
            raise TypeError(f"speaker_features returned {type(feat).__name__} for a single waveform")
        emb = self._embed(backend, feat)
        mel = frontend.prompt_mel_24k(wav_24k).to(device=device, dtype=torch.float32)
        mel_len = torch.tensor([mel.shape[1]], dtype=torch.int32, device=device)
        return PromptFeatures(
            speaker_embedding=emb,
            prompt_mel=mel,
            prompt_mel_len=mel_len,
            digest=digest,
            backend=backend.name,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.model_path)!r}, device={self._device_spec!r}, spk={self.spk_backend})"


def _prompt_source(prompt_wav: PromptWav) -> tuple[str, Callable[[], PromptAudio]]:
    """(content digest, loader of the decoded 16 kHz / 24 kHz prompt) for any accepted prompt form.

    A mono `(waveform, rate)` pair is hashed directly (same digest format as the front end's), so
    a cache hit costs one hash and no decoding or resampling. Files, bytes and multi-channel arrays
    are decoded to get the digest. On a miss the loader runs the front end on the ORIGINAL input, so
    its errors name the file or array as the caller passed it.
    """
    from vllm_omni.model_executor.models import audio as frontend

    if isinstance(prompt_wav, tuple) and len(prompt_wav) == 2:
        waveform, rate = prompt_wav
        if isinstance(waveform, np.ndarray | torch.Tensor) and waveform.ndim == 1 and isinstance(rate, int):
            return waveform_digest(waveform, rate), lambda: frontend.load_prompt_audio(prompt_wav)
    decoded = frontend.decode_audio(prompt_wav, max_seconds=frontend.DEFAULT_MAX_PROMPT_SECONDS)
    return decoded.digest(), lambda: frontend.load_prompt_audio(prompt_wav)


__all__ = [
    "PROMPT_MEL_RATE",
    "SPEAKER_RATE",
    "STEP_AUDIO2_ASSETS",
    "PromptFeatures",
    "PromptWav",
    "StepAudio2Token2WavCore",
    "Token2WavAssets",
]
