# SPDX-License-Identifier: Apache-2.0
"""The speaker-prompt component every Token2Wav facade owns: speaker-embedding backend and prompt-feature cache.

A request's reference voice becomes a CAM++ speaker embedding and a 24 kHz prompt mel, computed once
per voice content on the serving device. Step-Audio2 / MiniCPM-o (`core.Token2WavCore`) and CosyVoice3
(`cosyvoice3_token2wav.CosyVoice3Token2Wav`) ship the same `campplus.onnx` and need exactly this: the
facade base (`facade.Token2WavFacade`) owns one `SpeakerPrompt` and forwards the facade API to it:

| member                              | job                                                              |
|-------------------------------------|------------------------------------------------------------------|
| `backend_name` / `model`            | the installed backend's name / the backend (installs the lazy ORT |
|                                     | fallback on first access; its session is built on its first call) |
| `install` / `enable` (`enable_device`, | install a caller's backend, or build one by request: device     |
| `enable_trt`)                       | path, graphed, TensorRT, fallback (`speaker_embedding.selection`) |
| `ensure_backend`                    | the fallback if nothing is installed (never replaces a backend)  |
| `reload`                            | campplus.onnx read again, rebuilt the way it was made; the prompt |
|                                     | cache and the owner's derived caches emptied                     |
| `prepare` / `compute`               | content-keyed prompt features (`PromptFeatures`), with the speech |
|                                     | tokens when the owner passes its tokenizer                       |
| `cache` / `cache_stats` / `clear_cache` | the prompt-feature LRU                                       |

Log lines and errors name the owning facade (`owner`), as they did when this lived in the core.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.models.audio.mel import MelConfig
from vllm_omni_token2wav.model_executor.models.speaker_embedding.backend import SpeakerEmbeddingBackend
from vllm_omni_token2wav.model_executor.models.speaker_embedding.selection import (
    BackendRequest,
    select_speaker_embedding_backend,
)
from vllm_omni_token2wav.model_executor.models.token2wav_core.assets import AssetDir, LazyDevice
from vllm_omni_token2wav.model_executor.models.token2wav_core.prompt_cache import CacheStats, ContentLruCache
from vllm_omni_token2wav.model_executor.models.token2wav_core.prompt_features import (
    EMBEDDING_DIM,
    PromptFeatures,
    fit_mel_to_tokens,
    waveform_digest,
)

if TYPE_CHECKING:
    from vllm_omni_token2wav.model_executor.layers.speech_tokenizer import SpeechTokenizerBackend
    from vllm_omni_token2wav.model_executor.models.audio import PromptAudio

logger = init_logger(__name__)

PromptWav = str | Path | bytes | tuple[np.ndarray | torch.Tensor, int]


@dataclass(frozen=True)
class InstalledBackend:
    """The speaker backend in use and how it was made (replaced as a whole, so readers need no lock)."""

    backend: SpeakerEmbeddingBackend
    #: How it was made, rebuilt that way by `reload` (None: a caller's backend, via `install`).
    request: BackendRequest | None


@dataclass(frozen=True)
class SpeakerModelSource:
    """Where the speaker backend comes from: the CAM++ file, the device, and the build options."""

    assets: AssetDir
    file_name: str
    device: LazyDevice
    ort_intra_op_threads: int = 1
    seg_pool_mode: str = "legacy"


class SpeakerPrompt:
    """Speaker-embedding backend lifecycle plus the prompt-feature cache of one facade (module table).

    Args:
        owner: the owning facade's class name (log lines and errors show it).
        source: the CAM++ file, device and backend build options.
        mel_config: the family's prompt-mel recipe.
        cache_size: entries of the prompt-feature LRU (0 disables storing).
        derived_caches: the owner's caches of values derived from embeddings, emptied by `reload`.
    """

    def __init__(
        self,
        owner: str,
        source: SpeakerModelSource,
        mel_config: MelConfig,
        *,
        cache_size: int,
        derived_caches: Sequence[ContentLruCache[Any]] = (),
    ) -> None:
        self.owner = owner
        self.source = source
        self.mel_config = mel_config
        self.cache: ContentLruCache[PromptFeatures] = ContentLruCache(cache_size, PromptFeatures.clone)
        self._derived_caches = tuple(derived_caches)
        self._lock = threading.Lock()
        self._installed: InstalledBackend | None = None

    @property
    def device(self) -> torch.device:
        return self.source.device.get()

    # ---- backend lifecycle ---------------------------------------------------------------------

    @property
    def backend_name(self) -> str:
        """Name of the backend that computes embeddings (the ORT fallback until another is installed)."""
        installed = self._installed
        return installed.backend.name if installed is not None else "onnxruntime-cpu"

    @property
    def model(self) -> SpeakerEmbeddingBackend:
        """The installed backend; installs the lazy ORT fallback when there is none (its session is not built)."""
        installed = self._installed
        if installed is None:
            installed = self.ensure_backend()
        return installed.backend

    def ensure_backend(self) -> InstalledBackend:
        """The installed backend, installing the lazy ORT fallback if none is (never replaces one)."""
        with self._lock:
            if self._installed is None:
                self._installed = InstalledBackend(self.build("fallback"), "fallback")
            return self._installed

    def install(self, backend: SpeakerEmbeddingBackend, request: BackendRequest | None = None) -> None:
        """Install any `SpeakerEmbeddingBackend`, replacing the current one (the prompt cache keys on its name)."""
        if not callable(backend) or not hasattr(backend, "name") or not hasattr(backend, "device"):
            raise TypeError(f"{backend!r} is not a SpeakerEmbeddingBackend (needs __call__, name and device)")
        with self._lock:
            self._installed = InstalledBackend(backend, request)
        # Once per process and (facade, backend): stages and benchmarks install backends many times.
        logger.info_once("%s: speaker embedding via %s", self.owner, backend.name)

    def enable(self, request: BackendRequest) -> str:
        """Build and install the backend of `request` (`select_speaker_embedding_backend`); its name.

        `"fallback"` installs a fresh lazy onnxruntime backend (its session is built on its first call).
        """
        backend = self.build(request)
        self.install(backend, request)
        return backend.name

    def enable_device(self) -> str:
        """Install the device path for this facade's device (`select_speaker_embedding_backend`); its name."""
        return self.enable("device")

    def enable_trt(self) -> str:
        """Install the TensorRT backend (CUDA with `tensorrt` only; raises otherwise); returns its name."""
        return self.enable("tensorrt")

    def reload(self) -> str:
        """Read campplus.onnx again: rebuild the backend the way it was made, empty the caches; its name.

        A backend passed to `install()` by a caller cannot be rebuilt here (RuntimeError). A device path
        that cannot be built from the new file raises and leaves everything as it was.
        """
        installed = self._installed
        if installed is not None and installed.request is None:
            raise RuntimeError(
                f"reload_spk_embedding(): the speaker backend {installed.backend.name} was passed to "
                "install_spk_backend(); build a new one from the changed file and install it"
            )
        request: BackendRequest = installed.request if installed is not None and installed.request else "fallback"
        fresh = self.build(request)
        with self._lock:
            self._installed = InstalledBackend(fresh, request)
            self.cache.clear()
            for cache in self._derived_caches:
                cache.clear()
        logger.info("%s: reloaded the speaker model %s (%s)", self.owner, fresh.name, request)
        return fresh.name

    def build(self, request: BackendRequest) -> SpeakerEmbeddingBackend:
        """A new backend for `request` on the facade's device (installs nothing)."""
        source = self.source
        return select_speaker_embedding_backend(
            source.assets.path(source.file_name),
            self.device,
            request=request,
            ort_intra_op_threads=source.ort_intra_op_threads,
            seg_pool_mode=source.seg_pool_mode,
        )

    def embed(self, backend: SpeakerEmbeddingBackend, feat: torch.Tensor) -> torch.Tensor:
        """Embedding `[1, 192]` float32 on the facade's device for fbank features `[T, 80]`."""
        emb = backend(feat)
        if tuple(emb.shape) != (1, EMBEDDING_DIM):
            raise ValueError(
                f"speaker backend {backend.name} returned an embedding of shape {list(emb.shape)}, "
                f"expected [1, {EMBEDDING_DIM}]"
            )
        return emb.to(device=self.device, dtype=torch.float32)

    # ---- prompt features -----------------------------------------------------------------------

    def prepare(self, prompt_wav: PromptWav, tokenizer: SpeechTokenizerBackend | None = None) -> PromptFeatures:
        """Speaker embedding and prompt mel of `prompt_wav` (+ its speech tokens with `tokenizer`), by content."""
        backend = self.model
        digest, load = prompt_source(prompt_wav)
        key = (digest, backend.name, tokenizer.name if tokenizer is not None else None)
        return self.cache.get_or_compute(key, lambda: self.compute(load(), digest, backend, tokenizer))

    @property
    def cache_stats(self) -> CacheStats:
        return self.cache.stats

    def clear_cache(self) -> None:
        self.cache.clear()

    def compute(
        self,
        audio: PromptAudio,
        digest: str,
        backend: SpeakerEmbeddingBackend,
        tokenizer: SpeechTokenizerBackend | None,
    ) -> PromptFeatures:
        """The prompt features of decoded `audio` (uncached; `prepare` is the cached path)."""
        from vllm_omni_token2wav.model_executor.models import audio as frontend
        from vllm_omni_token2wav.model_executor.models.speaker_embedding.features import speaker_features

        # The host work that needs the audio's values (decoding, resampling, the level and length checks)
        # is done: from here on nothing reads a device value back until the features are used, so the
        # launching thread never waits for the device. Host -> device copies are non-blocking (a
        # pageable copy is staged at once; a blocking one would wait for the stream to drain).
        device = self.device
        wav_16k = torch.as_tensor(audio.wav_16k, dtype=torch.float32).to(device, non_blocking=True)
        wav_24k = torch.as_tensor(audio.wav_24k, dtype=torch.float32).to(device, non_blocking=True)
        feat = speaker_features(wav_16k)
        if not isinstance(feat, torch.Tensor):  # only batched calls with lengths return a tuple
            raise TypeError(f"speaker_features returned {type(feat).__name__} for a single waveform")
        emb = self.embed(backend, feat)
        mel = frontend.log_mel_spectrogram(wav_24k, self.mel_config).to(device=device, dtype=torch.float32)
        tokens = token_len = None
        if tokenizer is not None:
            codes, count = tokenizer.tokenize(wav_16k)
            if count < 1:
                raise ValueError(f"prompt audio gives no speech tokens ({wav_16k.shape[0]} samples at 16 kHz)")
            tokens = codes.reshape(1, -1)[:, :count].to(device=device, dtype=torch.int32, non_blocking=True)
            token_len = _host_int(count, device)
            mel = fit_mel_to_tokens(mel, count)
        mel_len = _host_int(mel.shape[1], device)
        return PromptFeatures(
            speaker_embedding=emb,
            prompt_mel=mel,
            prompt_mel_len=mel_len,
            digest=digest,
            backend=backend.name,
            prompt_tokens=tokens,
            prompt_token_len=token_len,
        )


def _host_int(value: int, device: torch.device) -> torch.Tensor:
    """`[value]` int32 on `device`, copied without waiting for the device's queue."""
    return torch.tensor([value], dtype=torch.int32).to(device, non_blocking=True)


def prompt_source(prompt_wav: PromptWav) -> tuple[str, Callable[[], PromptAudio]]:
    """(content digest, loader of the decoded 16 kHz / 24 kHz prompt) for any accepted prompt form.

    A mono `(waveform, rate)` pair is hashed directly (same digest format as the front end's), so
    a cache hit costs one hash and no decoding or resampling. Files, bytes and multi-channel arrays
    are decoded to get the digest. On a miss the loader runs the front end on the ORIGINAL input, so
    its errors name the file or array as the caller passed it.
    """
    from vllm_omni_token2wav.model_executor.models import audio as frontend

    def load() -> PromptAudio:
        with _prompt_limit_advice():
            return frontend.load_prompt_audio(prompt_wav)

    if isinstance(prompt_wav, tuple) and len(prompt_wav) == 2:
        waveform, rate = prompt_wav
        if isinstance(waveform, np.ndarray | torch.Tensor) and waveform.ndim == 1 and isinstance(rate, int):
            return waveform_digest(waveform, rate), load
    with _prompt_limit_advice():
        decoded = frontend.decode_audio(prompt_wav, max_seconds=frontend.DEFAULT_MAX_PROMPT_SECONDS)
    return decoded.digest(), load


@contextlib.contextmanager
def _prompt_limit_advice() -> Iterator[None]:
    """Re-phrase the front end's too-long error with advice that works here: the facades take no
    `max_seconds` / `truncate` (a prompt is the voice to clone; silently cutting it is the caller's call)."""
    from vllm_omni_token2wav.model_executor.models.audio import AudioTooLongError

    try:
        yield
    except AudioTooLongError as exc:
        limit = f"{exc.max_seconds:g}"
        raise ValueError(
            f"{exc.origin}: prompt is {exc.seconds:.2f} s long, over the {limit} s prompt limit of the Token2Wav "
            f"facades; pass a shorter prompt, e.g. its first {limit} s as (waveform[: int({limit} * rate)], rate)"
        ) from None


__all__ = [
    "BackendRequest",
    "InstalledBackend",
    "PromptWav",
    "SpeakerModelSource",
    "SpeakerPrompt",
    "prompt_source",
]
