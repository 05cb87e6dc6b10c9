# SPDX-License-Identifier: Apache-2.0
"""The base of every Token2Wav facade: asset folder, lazy device, speaker prompt and model-loading lifecycle.

Every family's facade serves the same request shape (speech tokens + a reference voice -> 24 kHz
audio) over an asset folder with the same `campplus.onnx`, so what they have in common is written
once here and the families subclass it:

| owned here (composition of `token2wav_core/` components) | what it gives                                     |
|----------------------------------------------------------|--------------------------------------------------|
| `asset_dir` (`assets.AssetDir`)                          | `asset_path(name)`, errors naming the file       |
| `_device` (`assets.LazyDevice`)                          | `device`, resolved on first use                  |
| `speaker_prompt` (`speaker_prompt.SpeakerPrompt`):       | `spk_backend`, `spk_model`, `install_spk_backend`, |
| the speaker-backend lifecycle                            | `enable_*_spk_embedding`, `reload_spk_embedding` |
| ... and the content-keyed prompt-feature cache           | `prepare_prompt`, `speaker_embedding`,           |
|                                                          | `prompt_cache_stats`, `clear_prompt_cache`       |
| `_lock` and the loading lifecycle                        | `load_models()` / `load()` / `models_loaded`:    |
|                                                          | assets checked, speaker fallback installed if    |
|                                                          | none, then the family's models, once             |

A family supplies its file names (`assets`), its prompt mel recipe (`prompt_mel_config`), whether
prompts are tokenised in-tree (`has_speech_tokenizer`), `check_assets()` and
`_load_synthesis_models()`, plus its own synthesis and stream API (`__call__`, `set_stream_cache`,
`stream`: the signatures differ between families). Subclasses: `core.Token2WavCore` (CosyVoice2
flow + HiFT: Step-Audio2 as `StepAudio2Token2WavCore`, MiniCPM-o as `MiniCPMO45Token2WavCore` and
its upstream-shaped `MiniCPMO45Token2wav`) and `cosyvoice3_token2wav.CosyVoice3Token2Wav` (DiT flow
+ causal HiFT). What the serving stage asks of any of them is the `StageCore` Protocol
(`token2wav_stage/stage_model.py`), which this class provides.

Construction opens no file and resolves no device; `load_models()` never replaces an installed
speaker backend and never builds the onnxruntime session (its first embedding does).
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from vllm_omni_token2wav.model_executor.models.audio.mel import MelConfig
from vllm_omni_token2wav.model_executor.models.token2wav_core.assets import AssetDir, LazyDevice, Token2WavAssets
from vllm_omni_token2wav.model_executor.models.token2wav_core.prompt_cache import CacheStats, ContentLruCache
from vllm_omni_token2wav.model_executor.models.token2wav_core.prompt_features import PromptFeatures
from vllm_omni_token2wav.model_executor.models.token2wav_core.speaker_prompt import (
    PromptWav,
    SpeakerModelSource,
    SpeakerPrompt,
)
from vllm_omni_token2wav.platforms import DeviceSpec

if TYPE_CHECKING:
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.backend import SpeakerEmbeddingBackend
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.selection import BackendRequest

DEFAULT_PROMPT_CACHE_SIZE = 16

#: The flow dtypes a facade accepts.
FLOW_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def facade_flow_dtype(float16: bool, flow_dtype: torch.dtype | None) -> torch.dtype:
    """The flow's dtype from upstream's `float16` flag and the explicit `flow_dtype` (which wins; a clash raises)."""
    if flow_dtype is None:
        return torch.float16 if float16 else torch.float32
    if flow_dtype not in FLOW_DTYPES:
        raise ValueError(f"flow_dtype must be one of float32, float16, bfloat16, got {flow_dtype!r}")
    if float16 and flow_dtype != torch.float16:
        raise ValueError(f"float16=True contradicts flow_dtype={flow_dtype}; pass one of them")
    return flow_dtype


class Token2WavFacade(abc.ABC):
    """What every Token2Wav facade owns and forwards (see the module table); families subclass it.

    Args:
        model_path: the family's asset folder.
        float16: run the flow in fp16 (the speaker path and the vocoder stay fp32); shorthand for
            `flow_dtype=torch.float16` (upstream's argument).
        flow_dtype: the flow's dtype (float32, float16 or bfloat16; None: fp16 with `float16`, else fp32).
            The serving stage picks it per platform (`token2wav_dtype`, `token2wav_stage/precision.py`).
        device: serving device; None means the platform's serving device (resolved on first use).
        n_timesteps: flow-matching Euler steps for synthesis.
        prompt_cache_size: entries of the prompt-feature LRU (0 disables storing).
        ort_intra_op_threads: intra-op threads of the speaker embedding's ORT fallback session (upstream: 1).
        spk_seg_pool_mode: CAM++ segment-pooling numerics of the torch device path (`campplus.segpool`).
        seed: the facade's default per-request seed (`request_seed`).
        derived_caches: the subclass's caches of values derived from speaker embeddings, emptied with
            the prompt cache by `reload_spk_embedding()`.
    """

    #: The file names of the family's asset folder.
    assets: ClassVar[Token2WavAssets]
    #: The flow's prompt mel recipe.
    prompt_mel_config: ClassVar[MelConfig]
    #: Whether prompts are tokenised in-tree (`speech_tokenizer`); else prompt tokens come with the request.
    has_speech_tokenizer: ClassVar[bool]

    def __init__(
        self,
        model_path: str | Path,
        *,
        float16: bool = False,
        flow_dtype: torch.dtype | None = None,
        device: DeviceSpec = None,
        n_timesteps: int = 10,
        prompt_cache_size: int = DEFAULT_PROMPT_CACHE_SIZE,
        ort_intra_op_threads: int = 1,
        spk_seg_pool_mode: str = "legacy",
        seed: int = 0,
        derived_caches: Sequence[ContentLruCache[Any]] = (),
    ) -> None:
        from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.segpool import check_seg_pool_mode

        if isinstance(n_timesteps, bool) or not isinstance(n_timesteps, int) or n_timesteps < 1:
            raise ValueError(f"n_timesteps must be an int >= 1, got {n_timesteps!r}")
        self.model_path = Path(model_path)
        self.flow_dtype = facade_flow_dtype(float16, flow_dtype)
        self.n_timesteps = n_timesteps
        self.ort_intra_op_threads = ort_intra_op_threads
        self.spk_seg_pool_mode = check_seg_pool_mode(spk_seg_pool_mode)
        self.seed = int(seed)
        owner = type(self).__name__
        self.asset_dir = AssetDir(self.model_path, owner)
        self._device = LazyDevice(device)
        # The re-entrant lock for model loading (the components guard their own state).
        self._lock = threading.RLock()
        self._models_loaded = False
        self.speaker_prompt = SpeakerPrompt(
            owner,
            SpeakerModelSource(
                self.asset_dir,
                self.assets.speaker_model,
                self._device,
                ort_intra_op_threads=ort_intra_op_threads,
                seg_pool_mode=self.spk_seg_pool_mode,
            ),
            self.prompt_mel_config,
            cache_size=prompt_cache_size,
            derived_caches=derived_caches,
        )

    # ---- configuration ---------------------------------------------------------------------

    @property
    def float16(self) -> bool:
        """Whether the flow runs in fp16 (upstream's attribute; `flow_dtype` says which reduced dtype)."""
        return self.flow_dtype == torch.float16

    @property
    def flow_dtype_name(self) -> str:
        """`float32`, `float16` or `bfloat16` (for logs and reports)."""
        return str(self.flow_dtype).removeprefix("torch.")

    @property
    def device(self) -> torch.device:
        """The facade's device (explicit, else the platform's serving device), resolved once."""
        return self._device.get()

    def asset_path(self, name: str | None) -> Path:
        """`model_path / name`, raising FileNotFoundError that names the missing file or directory."""
        return self.asset_dir.path(name)

    def request_seed(self, seed: int | None) -> int:
        """A request's seed: `seed`, else the facade's default."""
        return self.seed if seed is None else int(seed)

    # ---- speaker-embedding backend (`speaker_prompt.SpeakerPrompt`) ------------------------------

    @property
    def spk_backend(self) -> str:
        """Name of the backend that computes embeddings (the ORT fallback until another is installed)."""
        return self.speaker_prompt.backend_name

    @property
    def spk_model(self) -> SpeakerEmbeddingBackend:
        """The installed speaker-embedding backend; installs the lazy ORT fallback when there is none.

        Never loads the synthesis modules and never builds the ORT session (its first call does).
        """
        return self.speaker_prompt.model

    def install_spk_backend(self, backend: SpeakerEmbeddingBackend) -> None:
        """Install any `SpeakerEmbeddingBackend`, replacing the current one (the prompt cache keys on its name)."""
        self.speaker_prompt.install(backend)

    def reload_spk_embedding(self) -> str:
        """Read campplus.onnx again: rebuild the speaker backend the way it was made, empty the caches.

        A running facade keeps the weights it loaded even when the file changes on disk. This rebuilds
        the installed backend with the same request (device path, TensorRT, or the lazy onnxruntime
        fallback, whose new session is built on its first call) and empties the prompt-feature cache
        and the derived caches (e.g. the core's stream set-up cache), which hold embeddings of the old
        weights. Streams set up before keep the embedding they started with. A backend passed to
        `install_spk_backend()` cannot be rebuilt here: that raises RuntimeError (install a new one).
        Returns the name of the backend now installed. A device path that cannot be built from the
        new file raises and leaves everything as it was; the fallback checks the file at its first call.
        """
        return self.speaker_prompt.reload()

    def enable_device_spk_embedding(self) -> str:
        """Install the device speaker-embedding path for this facade's device; returns its name.

        NPU -> torch CAM++ on the NPU; CUDA -> TensorRT when importable, else torch; CPU -> the
        recorded faster backend (`CPU_DEVICE_PATH_BACKEND`). See `select_speaker_embedding_backend`.
        Builds neither the synthesis modules nor the ORT session; raises if the path cannot be built.
        """
        return self.speaker_prompt.enable_device()

    def enable_spk_embedding(self, request: BackendRequest) -> str:
        """Install the speaker backend of `request` ("device", "graphed", "tensorrt", "fallback"); its name.

        The stage asks for what `speaker_embedding.selection.stage_backend_request` decides.
        """
        return self.speaker_prompt.enable(request)

    def enable_trt_spk_embedding(self) -> str:
        """Install the TensorRT backend (CUDA with `tensorrt` only; raises otherwise); returns its name."""
        return self.speaker_prompt.enable_trt()

    # ---- prompt features ---------------------------------------------------------------------

    def prepare_prompt(self, prompt_wav: PromptWav) -> PromptFeatures:
        """Speaker embedding and prompt mel (the family's `prompt_mel_config`) of `prompt_wav`, cached by content.

        `prompt_wav` is a path, encoded audio bytes, or `(waveform, sample_rate)` (mono or
        channels-first, float in [-1, 1] or integer PCM). Errors of the audio front end (missing
        file, undecodable bytes, empty or too long audio) surface unchanged. The returned features
        are the caller's own copy.
        """
        return self.speaker_prompt.prepare(prompt_wav)

    def speaker_embedding(self, prompt_wav: PromptWav) -> torch.Tensor:
        """`prepare_prompt(prompt_wav).speaker_embedding` (`[1, 192]` float32 on the facade's device)."""
        return self.prepare_prompt(prompt_wav).speaker_embedding

    @property
    def prompt_cache_stats(self) -> CacheStats:
        return self.speaker_prompt.cache_stats

    def clear_prompt_cache(self) -> None:
        self.speaker_prompt.clear_cache()

    # ---- assets and models -------------------------------------------------------------------

    @abc.abstractmethod
    def check_assets(self) -> list[Path]:
        """Paths of every asset this family needs, raising FileNotFoundError for the first missing one.

        Opens nothing: wrappers and the stage call it at construction so a broken directory fails the
        stage start while loading stays lazy.
        """

    @abc.abstractmethod
    def _load_synthesis_models(self) -> None:
        """Build the family's synthesis models (called once, under `_lock`, by `load_models`)."""

    @property
    def models_loaded(self) -> bool:
        """Whether `load_models()` has run (the stage builds the models late when the runner skipped it)."""
        return self._models_loaded

    def load_models(self) -> None:
        """Idempotently load everything synthesis needs: check the assets, install the speaker fallback if no
        backend is installed (never replacing one, never building its ORT session), build the family's models.

        Models are built by explicit dtype (fp32; the flow in `flow_dtype`), never through the process
        default dtype.
        """
        if self._models_loaded:
            return
        with self._lock:
            if self._models_loaded:
                return
            self.check_assets()
            self.speaker_prompt.ensure_backend()
            self._load_synthesis_models()
            self._models_loaded = True

    def load(self) -> None:
        """`load_models()` (upstream's name for loading every model now)."""
        self.load_models()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.model_path)!r}, device={self._device.spec!r}, spk={self.spk_backend})"


__all__ = ["DEFAULT_PROMPT_CACHE_SIZE", "Token2WavFacade"]
