# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3's Token2Wav facade: speech tokens + a reference voice -> 24 kHz audio, whole or streamed.

Fun-CosyVoice3 ships the same `campplus.onnx` as Step-Audio2, so the speaker path (backend selection,
laziness, device switch, prompt cache), the asset folder, the lazy device and the loading lifecycle
come from the facade base every family shares (`token2wav_core/facade.py` `Token2WavFacade`); this
class adds its own models and stream API and is not a `Token2WavCore` (CosyVoice2 flow + HiFT).
What is CosyVoice3's:

| part            | CosyVoice3                                                                     |
|-----------------|--------------------------------------------------------------------------------|
| config          | `cosyvoice3.yaml` (`flow:` and `hift:` sections, read as data)                 |
| flow            | `flow.pt`: DiT `CausalMaskedDiffWithDiT` (`flow/`), constant-work streaming     |
| vocoder         | `hift.pt`: causal HiFT (`hift/`), bounded streaming, fixed noise table          |
| prompt mel      | fmax 12 kHz (`prompt.COSYVOICE3_MEL_CONFIG`), aligned to the tokens by truncation |
| prompt tokens   | given by the caller (as vLLM-Omni's talker sends them); speech_tokenizer_v3 is |
|                 | not in-tree (`has_speech_tokenizer` is False; there is no `speech_tokenizer`)  |

Requests:
- `prompt(prompt_wav, prompt_tokens)` -> `CosyVoice3Prompt` (embedding + mel cached by content);
- `__call__(tokens, prompt_wav, prompt_tokens=...)`: a whole utterance, `(1, 960 T)`;
- `set_stream_cache(prompt_wav, prompt_tokens=...)` -> `CosyVoice3Stream`, then
  `stream(new_tokens, state=..., last_chunk=...)` per chunk: the ids received since the previous call
  (no re-sent lookahead; `upstream_chunks` cuts a token sequence on upstream's schedule). `state=` is
  required (there is no default stream), and a chunk of a stream while another chunk of it runs in
  another thread raises `StreamInUseError` (`token2wav_stream.StepGuard`) instead of interleaving them.
The stage (`cosyvoice3/backend.py`) runs the same kernels for many requests per launch.

`seed` picks the flow's noise table per request (default: the facade's `seed`, 0 = upstream's table);
`final_chunk` how a stream's last chunk attends (`flow.FinalChunk`): by default with full attention over
the whole utterance, as upstream's last call (its audio); `FinalChunk.BLOCK_CAUSAL` for constant cost.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import DEFAULT_FINAL_CHUNK, FinalChunk, stream_calls
from vllm_omni_token2wav.model_executor.models.audio.mel import MelConfig
from vllm_omni_token2wav.model_executor.models.cosyvoice3.prompt import (
    COSYVOICE3_MEL_CONFIG,
    CosyVoice3Prompt,
    build_prompt,
    token_ids,
)
from vllm_omni_token2wav.model_executor.models.cosyvoice3.synthesis import (
    StreamCaches,
    StreamRow,
    open_stream,
    stream_rows,
    synthesize_whole,
)
from vllm_omni_token2wav.model_executor.models.token2wav_core.assets import Token2WavAssets
from vllm_omni_token2wav.model_executor.models.token2wav_core.facade import DEFAULT_PROMPT_CACHE_SIZE, Token2WavFacade
from vllm_omni_token2wav.model_executor.models.token2wav_core.speaker_prompt import (
    PromptWav,
)
from vllm_omni_token2wav.model_executor.models.token2wav_core.stream import StepGuard, waveform_to_pcm16
from vllm_omni_token2wav.platforms import DeviceSpec

if TYPE_CHECKING:
    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import CausalMaskedDiffWithDiT
    from vllm_omni_token2wav.model_executor.layers.hift_causal import CausalHiFTGenerator, CausalHiFTStreamer

logger = init_logger(__name__)

COSYVOICE3_ASSETS = Token2WavAssets(
    speaker_model="campplus.onnx",
    speech_tokenizer="speech_tokenizer_v3.onnx",  # shipped, not used in-tree (prompt tokens come with the request)
    flow_config="cosyvoice3.yaml",
    flow="flow.pt",
    hift="hift.pt",
)


@dataclass
class CosyVoice3Stream:
    """One streaming request of the facade (`set_stream_cache`); `caches` is replaced after each chunk,
    `guard` refuses a chunk while another chunk of this stream runs (`StreamInUseError`)."""

    prompt: CosyVoice3Prompt
    caches: StreamCaches
    chunks_done: int = 0
    samples_emitted: int = 0
    guard: StepGuard = field(default_factory=StepGuard, repr=False, compare=False)

    @property
    def finished(self) -> bool:
        return self.caches.finished


@dataclass(frozen=True)
class CosyVoice3Models:
    """What `load_models()` builds: the DiT flow, the causal HiFT and the HiFT's shared streamer."""

    flow: CausalMaskedDiffWithDiT
    hift: CausalHiFTGenerator
    streamer: CausalHiFTStreamer


def upstream_chunks(num_tokens: int, prompt_tokens: int) -> Iterator[tuple[slice, bool]]:
    """Upstream's streaming schedule as `(slice of new ids, last)` pairs for `stream()`: 25 + pad, 50, 100, ...
    tokens per chunk (plus 3 lookahead tokens held until the next one), the rest with the last."""
    for call in stream_calls(num_tokens, prompt_tokens):
        yield slice(call.start, call.end), call.final


class CosyVoice3Token2Wav(Token2WavFacade):
    """CosyVoice3's token2wav over a Fun-CosyVoice3 model directory (see the module docstring).

    Args:
        model_path: the Fun-CosyVoice3 directory (`campplus.onnx`, `flow.pt`, `hift.pt`, `cosyvoice3.yaml`).
        float16: run the flow in fp16 (speaker path and vocoder stay fp32).
        flow_dtype: the flow's dtype (float32 / float16 / bfloat16; None: from `float16`), `Token2WavFacade`.
        device: serving device; None means the platform's serving device (resolved on first use).
        n_timesteps: flow-matching Euler steps.
        prompt_cache_size: entries of the prompt-feature LRU (0 disables storing).
        ort_intra_op_threads: intra-op threads of the ORT fallback session of the speaker embedding.
        spk_seg_pool_mode: CAM++ segment-pooling numerics of the torch device path (`campplus.segpool`).
        seed: the flow's default noise table (0 = upstream's).
        final_chunk: how a stream's last chunk attends (`flow.FinalChunk`; default FULL_ATTENTION, upstream's).
    """

    assets: ClassVar[Token2WavAssets] = COSYVOICE3_ASSETS
    prompt_mel_config: ClassVar[MelConfig] = COSYVOICE3_MEL_CONFIG
    #: speech_tokenizer_v3 is not in-tree: prompt tokens come with the request (`prompt_tokens=`).
    has_speech_tokenizer: ClassVar[bool] = False

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
        final_chunk: FinalChunk = DEFAULT_FINAL_CHUNK,
    ) -> None:
        if not isinstance(final_chunk, FinalChunk):
            raise ValueError(f"final_chunk must be a FinalChunk, got {final_chunk!r}")
        super().__init__(
            model_path,
            float16=float16,
            flow_dtype=flow_dtype,
            device=device,
            n_timesteps=n_timesteps,
            prompt_cache_size=prompt_cache_size,
            ort_intra_op_threads=ort_intra_op_threads,
            spk_seg_pool_mode=spk_seg_pool_mode,
            seed=seed,
        )
        self.final_chunk = final_chunk
        self._models: CosyVoice3Models | None = None

    # ---- assets and models (`Token2WavFacade.load_models` calls `_load_synthesis_models`) -------

    def check_assets(self) -> list[Path]:
        """The files synthesis needs (campplus.onnx, flow.pt, hift.pt; cosyvoice3.yaml when present).

        speech_tokenizer_v3.onnx is not needed: prompt tokens come with the request.
        """
        paths = [self.asset_path(name) for name in (self.assets.speaker_model, self.assets.flow, self.assets.hift)]
        config = self.model_path / str(self.assets.flow_config)
        return [*paths, config] if config.is_file() else paths

    def _load_synthesis_models(self) -> None:
        from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import load_flow
        from vllm_omni_token2wav.model_executor.layers.hift_causal import (
            COSYVOICE3_STREAM,
            CausalHiFTStreamer,
            load_causal_hift,
        )
        from vllm_omni_token2wav.model_executor.layers.hift_causal.config import (
            check_hift_yaml,
            hift_config_from_yaml,
        )

        device = self.device
        flow = load_flow(self.model_path, device=device, dtype=self.flow_dtype)
        hift = load_causal_hift(self.asset_path(self.assets.hift), device=device)
        config_path = self.model_path / str(self.assets.flow_config)
        if config_path.is_file():
            declared = hift_config_from_yaml(config_path)
            if declared is not None:
                check_hift_yaml(declared, hift.config, str(config_path))
        logger.info(
            "%s: flow (%s) and causal HiFT (float32) loaded on %s", type(self).__name__, self.flow_dtype_name, device
        )
        self._models = CosyVoice3Models(flow, hift, CausalHiFTStreamer(hift, COSYVOICE3_STREAM))

    @property
    def models(self) -> CosyVoice3Models:
        """Flow, causal HiFT and its streamer (`load_models()` first)."""
        self.load_models()
        assert self._models is not None
        return self._models

    @property
    def flow(self) -> CausalMaskedDiffWithDiT:
        return self.models.flow

    @property
    def hift(self) -> CausalHiFTGenerator:
        return self.models.hift

    @property
    def streamer(self) -> CausalHiFTStreamer:
        """The causal HiFT's streamer (`COSYVOICE3_STREAM`), shared by every stream of this facade."""
        return self.models.streamer

    # ---- prompts -------------------------------------------------------------------------------

    def prompt(self, prompt_wav: PromptWav, prompt_tokens: Any) -> CosyVoice3Prompt:
        """The flow's prompt for reference audio and its speech tokens (`(T,)` / `(1, T)` ids in [0, 6561)).

        The speaker embedding (installed backend: the device path on NPU / CUDA) and the 12 kHz-band mel
        are computed once per audio content (`prepare_prompt`'s cache); tokens and mel are then aligned
        by truncation. Errors: a prompt over 30 s, ids out of range, no tokens.
        """
        ids = token_ids(prompt_tokens, "prompt_tokens")
        features = self.prepare_prompt(prompt_wav)
        digest = hashlib.sha256(ids.numpy().tobytes()).hexdigest()[:16]
        key = f"audio:{features.digest}:{features.backend}:{digest}"
        return build_prompt(
            ids, features.prompt_mel, features.speaker_embedding, key=key, device=self.device, where="prompt"
        )

    def _resolve_prompt(
        self, prompt_wav: PromptWav | None, prompt_tokens: Any, prompt: CosyVoice3Prompt | None
    ) -> CosyVoice3Prompt:
        if prompt is not None:
            if prompt_wav is not None or prompt_tokens is not None:
                raise ValueError("give either prompt= or prompt_wav + prompt_tokens, not both")
            return prompt.to(self.device)
        if prompt_wav is None or prompt_tokens is None:
            raise ValueError(
                "CosyVoice3 needs the reference voice's audio AND its speech tokens (prompt_wav=..., "
                "prompt_tokens=...), or a CosyVoice3Prompt (prompt=...)"
            )
        return self.prompt(prompt_wav, prompt_tokens)

    # ---- synthesis -------------------------------------------------------------------------------

    def __call__(
        self,
        tokens: Any,
        prompt_wav: PromptWav | None = None,
        *,
        prompt_tokens: Any = None,
        prompt: CosyVoice3Prompt | None = None,
        seed: int | None = None,
    ) -> torch.Tensor:
        """Whole utterance: `(1, 960 T)` float32 audio of `T >= 1` speech tokens in the prompt's voice."""
        ids = token_ids(tokens, "tokens")
        if ids.shape[1] == 0:
            raise ValueError("tokens: no speech tokens to synthesise")
        voice = self._resolve_prompt(prompt_wav, prompt_tokens, prompt)
        return synthesize_whole(
            self.flow, self.hift, voice, ids, n_timesteps=self.n_timesteps, noise_seed=self.request_seed(seed)
        )

    def set_stream_cache(
        self,
        prompt_wav: PromptWav | None = None,
        *,
        prompt_tokens: Any = None,
        prompt: CosyVoice3Prompt | None = None,
        seed: int | None = None,
    ) -> CosyVoice3Stream:
        """Start a stream in the prompt's voice (the prompt's frames run with the first chunk)."""
        voice = self._resolve_prompt(prompt_wav, prompt_tokens, prompt)
        caches = open_stream(
            self.flow,
            self.streamer,
            voice,
            n_timesteps=self.n_timesteps,
            noise_seed=self.request_seed(seed),
            final_chunk=self.final_chunk,
        )
        return CosyVoice3Stream(prompt=voice, caches=caches)

    def stream(
        self,
        tokens: Sequence[int] | torch.Tensor,
        prompt_wav: PromptWav | None = None,
        last_chunk: bool = False,
        return_waveform: bool = False,
        *,
        state: CosyVoice3Stream | None = None,
    ) -> torch.Tensor | bytes:
        """Feed the ids received since the previous chunk; returns the new audio (`(1, N)` or int16 PCM bytes).

        Non-final chunks return audio up to 8 mel frames before the newest; the last chunk returns the
        rest. A failing chunk leaves `state` unchanged. `prompt_wav` is accepted for upstream-style
        callers and must not be given (the stream's prompt is fixed at `set_stream_cache`). A chunk
        while another chunk of the same stream runs raises `StreamInUseError` (one stream per caller).
        """
        if not isinstance(state, CosyVoice3Stream):
            raise TypeError(
                "stream(): state must be the CosyVoice3Stream that set_stream_cache() returned, "
                f"got {type(state).__name__}"
            )
        if prompt_wav is not None:
            raise ValueError("stream(): the stream keeps the prompt of set_stream_cache(); do not pass prompt_wav")
        ids = token_ids(tokens, "stream tokens")
        with state.guard.step("stream()"):
            if state.finished:
                raise RuntimeError("stream(): this stream already had its last chunk; set up a new one")
            ((audio, caches),) = stream_rows(self.flow, self.streamer, [StreamRow(state.caches, ids, last_chunk)])
            state.caches = caches
            state.chunks_done += 1
            state.samples_emitted += int(audio.shape[-1])
        speech = audio.reshape(1, -1)
        return speech if return_waveform else waveform_to_pcm16(speech)


__all__ = ["COSYVOICE3_ASSETS", "CosyVoice3Models", "CosyVoice3Stream", "CosyVoice3Token2Wav", "upstream_chunks"]
