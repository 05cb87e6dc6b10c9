# SPDX-License-Identifier: Apache-2.0
"""The CosyVoice2-flow + HiFT Token2Wav core: a lazy facade over a Step-Audio2-layout token2wav directory.

Step-Audio2 uses it as is (`step_audio2.StepAudio2Token2WavCore` is this class under its name) and
MiniCPM-o 4.5 under its own names (`minicpmo_4_5_token2wav.py`: `MiniCPMO45Token2WavCore`, and
`MiniCPMO45Token2wav` with its variant choice). What every facade owns (asset folder, lazy device,
`speaker_prompt.SpeakerPrompt`, the loading lifecycle and the speaker / prompt forwarding) is the base
class `facade.Token2WavFacade`, which CosyVoice3's facade (`cosyvoice3_token2wav.py`) subclasses too;
this class adds the speech tokenizer, flow and HiFT, the stream set-up cache and the streaming API.

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
| `check_assets()`                     | every asset file of the family is known to exist; nothing loaded   |
| `load_models()`                      | speaker fallback installed if none (never replaces one); speech    |
|                                      | tokenizer, flow and HiFT loaded (fp32 by explicit dtype)           |
| `speech_tokenizer` / `flow` / `hift` | `load_models()` first (also `load()`, both from the base class)    |
| `reload_spk_embedding()`             | campplus.onnx read again: the backend rebuilt the way it was made, |
|                                      | prompt-feature and stream set-up caches emptied                    |

Files changed on disk: a running facade keeps what it loaded (the speaker backend with its torch
model, onnxruntime session or TensorRT engine; speech tokenizer, flow, HiFT; cached prompt
features). Replacing `campplus.onnx` takes effect after `reload_spk_embedding()` (streams already
set up finish with the embedding they started with); for the synthesis files build a new facade.
A new facade never gets stale CAM++ weights: the torch model and TensorRT engine caches key on the
file's content digest (`vllm_omni_token2wav.file_identity`).

Request paths (computation in `synthesis.py`, stream state in `stream.py`):

- `prepare_prompt(prompt_wav)`: speaker embedding + 24 kHz mel, cached by content (speaker path);
  `with_tokens=True` adds the prompt's speech tokens and fits the mel to them (what synthesis uses).
- `__call__(tokens, prompt_wav)`: whole utterance -> waveform `[1, 480 * 2 * len(tokens)]`.
- `set_stream_cache(prompt_wav) -> Token2WavStream`, then `stream(tokens, ..., state=stream)` per
  chunk (25 tokens + 3 lookahead; `stream_chunks()` does the reference's chunking). The flow's
  post-prompt cache is computed once per prompt and shared (it is never modified). A chunk runs as
  one row of the batched kernels the serving stage uses for many requests (`token2wav_stage/`).
  Concurrent misuse is refused, never computed (`StreamInUseError`): a chunk of a stream while
  another chunk of it runs, and `stream()` without `state=` (the default stream, upstream's
  single-stream API) from a thread other than the one whose `set_stream_cache` set it up.

The vocoder is chosen at construction (`vocoder=VocoderKind...`, table in `stream_vocoder.py`):
Step-Audio2's HiFT (`hift.pt`, streamed with a cross-fade), or MiniCPM-o's causal HiFT in the
minicpmo-utils 1.0.7 layout (`config.yaml` + causal `hift.pt` streamed bounded, `hift_original.pt`
for whole utterances, loaded on first use; `causal_vocoder.py`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.layers.flow import ConformerTrim, Lookahead
from vllm_omni_token2wav.model_executor.layers.flow.batched import FlowRowState, project_speaker
from vllm_omni_token2wav.model_executor.layers.flow.streaming import CACHE_TAIL_FRAMES
from vllm_omni_token2wav.model_executor.models.audio.mel import PROMPT_MEL_CONFIG, MelConfig
from vllm_omni_token2wav.model_executor.models.token2wav_core.assets import (
    STEP_AUDIO2_ASSETS,
    Token2WavAssets,
)
from vllm_omni_token2wav.model_executor.models.token2wav_core.causal_vocoder import VOCODER_CONFIG, WHOLE_UTTERANCE_HIFT
from vllm_omni_token2wav.model_executor.models.token2wav_core.facade import DEFAULT_PROMPT_CACHE_SIZE, Token2WavFacade
from vllm_omni_token2wav.model_executor.models.token2wav_core.prompt_cache import ContentLruCache
from vllm_omni_token2wav.model_executor.models.token2wav_core.prompt_features import (
    PROMPT_MEL_RATE,
    SPEAKER_RATE,
    TOKEN_MEL_RATIO,
    PromptFeatures,
)
from vllm_omni_token2wav.model_executor.models.token2wav_core.speaker_prompt import (
    PromptWav,
    prompt_source,
)
from vllm_omni_token2wav.model_executor.models.token2wav_core.stream import (
    CHUNK_TOKENS,
    OWN_STREAM_ADVICE,
    PRE_LOOKAHEAD_TOKENS,
    StreamInUseError,
    Token2WavStream,
    crossfade_window,
    waveform_to_pcm16,
)
from vllm_omni_token2wav.model_executor.models.token2wav_core.stream_vocoder import (
    CrossfadeHiFTVocoder,
    StreamVocoder,
    VocoderKind,
)
from vllm_omni_token2wav.model_executor.models.token2wav_core.synthesis import (
    SpeechTokens,
    open_stream,
    setup_flow_stream,
    speech_token_tensor,
    stream_chunk,
    synthesize_utterance,
)
from vllm_omni_token2wav.platforms import DeviceSpec

if TYPE_CHECKING:
    from vllm_omni_token2wav.model_executor.layers.flow import CausalMaskedDiffWithXvec
    from vllm_omni_token2wav.model_executor.layers.hift import HiFTGenerator
    from vllm_omni_token2wav.model_executor.layers.speech_tokenizer import SpeechTokenizerBackend

logger = init_logger(__name__)

DEFAULT_STREAM_SETUP_CACHE_SIZE = 4
#: Token ids the flow model accepts (25 Hz FSQ codes).
SPEECH_VOCAB_SIZE = 6561


@dataclass(frozen=True)
class DefaultStream:
    """The facade's default stream and the thread whose `set_stream_cache` made it (the one it serves)."""

    stream: Token2WavStream
    thread: threading.Thread


class Token2WavCore(Token2WavFacade):
    """Step-Audio2's token2wav over `model_path`: prompt path and synthesis (see the module table).

    Args:
        model_path: token2wav directory (`campplus.onnx`, `speech_tokenizer_v2_25hz.onnx`,
            `flow.yaml`, `flow.pt`, `hift.pt`).
        float16: run the flow model in fp16 (the speaker path, tokenizer and HiFT stay fp32).
        flow_dtype: the flow's dtype (float32 / float16 / bfloat16; None: from `float16`), `Token2WavFacade`.
        device: serving device; None means the platform's serving device (resolved on first use).
        n_timesteps: flow-matching Euler steps for synthesis (10 as upstream; 5 halves the flow cost).
        prompt_cache_size: entries of the prompt-feature LRU (0 disables storing).
        ort_intra_op_threads: intra-op threads of the ORT fallback session (upstream: 1).
        spk_seg_pool_mode: CAM++ segment-pooling numerics of the torch device path: `"legacy"`
            (onnxruntime <= 1.28, what the flow models were trained on) or `"auto"` (agree with the
            installed onnxruntime, i.e. with the ORT fallback). See `campplus.segpool`.
        speech_tokenizer_backend: `"auto"` (onnxruntime on CPU, where it measured 3.6x faster; the
            in-tree torch model on NPU/CUDA), `"torch"` or `"onnx"`. Both give identical tokens.
        stream_lookahead: the 3 tokens appended to the prompt tokens when a stream is set up
            (`Lookahead.PROMPT_HEAD`: Step-Audio2; `Lookahead.SILENCE`: MiniCPM-o builds).
        conformer_trim: conformer-cache trimming of streams (`ConformerTrim.NONE`: Step-Audio2;
            `PROMPT_PLUS_TAIL`: the MiniCPM-o fix that lets streams run past ~100 s).
        stream_setup_cache_size: prompts whose post-prompt flow cache is kept (0 disables storing).
        seed: seed of each request's NSF-noise generator, so a request's audio depends only on its
            inputs (upstream draws from the global RNG).
        kv_cache_dtype: storage dtype of the streams' estimator attention caches (None: the flow's
            dtype). `torch.bfloat16` halves the largest per-stream state at a measured audio
            deviation (docs/design/token2wav_stage.md, "Memory"); computation stays in the flow's dtype.
        vocoder: `VocoderKind.HIFT` (`hift.pt`, streamed with the Hamming cross-fade) or
            `VocoderKind.CAUSAL_HIFT` (minicpmo-utils 1.0.7: `config.yaml` + causal `hift.pt` streamed
            bounded, `hift_original.pt` for whole utterances). See `stream_vocoder.py`.
    """

    #: Whether this family's prompts are tokenised in-tree (`speech_tokenizer`); CosyVoice3's are not.
    has_speech_tokenizer: ClassVar[bool] = True

    assets: ClassVar[Token2WavAssets] = STEP_AUDIO2_ASSETS
    #: The flow's prompt mel recipe (fmax 8 kHz here; CosyVoice3 uses Nyquist, 12 kHz).
    prompt_mel_config: ClassVar[MelConfig] = PROMPT_MEL_CONFIG

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
        speech_tokenizer_backend: str = "auto",
        stream_lookahead: Lookahead = Lookahead.PROMPT_HEAD,
        conformer_trim: ConformerTrim = ConformerTrim.NONE,
        stream_setup_cache_size: int = DEFAULT_STREAM_SETUP_CACHE_SIZE,
        seed: int = 0,
        kv_cache_dtype: torch.dtype | None = None,
        vocoder: VocoderKind | str = VocoderKind.HIFT,
    ) -> None:
        try:
            vocoder = VocoderKind(vocoder)
        except ValueError:
            raise ValueError(f"vocoder must be one of {[k.value for k in VocoderKind]}, got {vocoder!r}") from None
        if kv_cache_dtype is not None and kv_cache_dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"kv_cache_dtype must be None, float32, float16 or bfloat16, got {kv_cache_dtype!r}")
        if speech_tokenizer_backend not in ("auto", "torch", "onnx"):
            raise ValueError(
                f"speech_tokenizer_backend must be 'auto', 'torch' or 'onnx', got {speech_tokenizer_backend!r}"
            )
        if not isinstance(stream_lookahead, Lookahead) or stream_lookahead is Lookahead.INCLUDED:
            raise ValueError(f"stream_lookahead must be Lookahead.PROMPT_HEAD or SILENCE, got {stream_lookahead!r}")
        if not isinstance(conformer_trim, ConformerTrim):
            raise ValueError(f"conformer_trim must be a ConformerTrim, got {conformer_trim!r}")
        # The flow state after a prompt is immutable (chunks return new states): shared, not copied.
        self._setup_cache: ContentLruCache[FlowRowState] = ContentLruCache(stream_setup_cache_size, lambda c: c)
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
            derived_caches=(self._setup_cache,),
        )
        self.speech_tokenizer_backend = speech_tokenizer_backend
        self.stream_lookahead = stream_lookahead
        self.conformer_trim = conformer_trim
        self.kv_cache_dtype = kv_cache_dtype
        self.vocoder_kind = vocoder
        self._tokenizer: SpeechTokenizerBackend | None = None
        self._flow: CausalMaskedDiffWithXvec | None = None
        # The whole-utterance HiFT (with VocoderKind.CAUSAL_HIFT: hift_original.pt, loaded on first use).
        self._hift: HiFTGenerator | None = None
        self._stream_vocoder: StreamVocoder | None = None
        self._window: torch.Tensor | None = None
        # The stream of the last `set_stream_cache` call, for callers of the upstream single-stream API,
        # with the thread it serves (replaced as a whole: readers see a consistent pair without a lock).
        self._default_stream: DefaultStream | None = None

    # ---- assets and models (`Token2WavFacade.load_models` calls `_load_synthesis_models`) -------

    def check_assets(self) -> list[Path]:
        """The five Step-Audio2 files (+ `config.yaml` for the causal vocoder); see `Token2WavFacade.check_assets`."""
        assets = self.assets
        names = [assets.speaker_model, assets.speech_tokenizer, assets.flow_config, assets.flow, assets.hift]
        if self.vocoder_kind is VocoderKind.CAUSAL_HIFT:
            # hift_original.pt is only needed for whole utterances: checked when one is requested.
            names.append(VOCODER_CONFIG)
        return [self._vocoder_asset(name) for name in names]

    def _vocoder_asset(self, name: str | None) -> Path:
        try:
            return self.asset_path(name)
        except FileNotFoundError as exc:
            if name == VOCODER_CONFIG:
                raise FileNotFoundError(
                    f"{exc}. The causal vocoder (minicpmo-utils 1.0.7 layout) is described by {VOCODER_CONFIG} next "
                    "to its hift.pt; a directory without it streams with the non-causal HiFT (VocoderKind.HIFT, "
                    "MiniCPM-o variant vllm-omni-0.30)"
                ) from None
            raise

    def _load_synthesis_models(self) -> None:
        from vllm_omni_token2wav.model_executor.layers.flow import load_flow
        from vllm_omni_token2wav.model_executor.layers.speech_tokenizer import select_speech_tokenizer

        device = self.device
        backend = self.speech_tokenizer_backend
        if backend == "auto":
            backend = "onnx" if device.type == "cpu" else "torch"
        config_name = self.assets.flow_config
        assert config_name is not None  # the Step-Audio2 layout ships a flow config
        tokenizer = select_speech_tokenizer(
            self.asset_path(self.assets.speech_tokenizer),
            backend=backend,  # type: ignore[arg-type]
            device=device,
        )
        flow = load_flow(
            (self.asset_path(config_name), self.asset_path(self.assets.flow)), device=device, dtype=self.flow_dtype
        )
        hift_path = self.asset_path(self.assets.hift)
        if self.vocoder_kind is VocoderKind.CAUSAL_HIFT:
            from vllm_omni_token2wav.model_executor.models.token2wav_core.causal_vocoder import (
                CausalHiFTVocoder,
                load_minicpmo_causal_vocoder,
            )

            causal = load_minicpmo_causal_vocoder(self.asset_path(VOCODER_CONFIG), hift_path, device=device)
            stream_vocoder: StreamVocoder = CausalHiFTVocoder(causal)
        else:
            hift = self._load_hift(hift_path, device)
            self._window = crossfade_window(device)
            stream_vocoder = CrossfadeHiFTVocoder(hift, self._window)
            self._hift = hift
        self._tokenizer, self._flow, self._stream_vocoder = tokenizer, flow, stream_vocoder
        logger.info(
            "%s: synthesis models loaded on %s (speech tokenizer %s, flow %s, vocoder %s)",
            type(self).__name__,
            device,
            tokenizer.name,
            self.flow_dtype_name,
            stream_vocoder.name,
        )

    def _load_hift(self, path: Path, device: torch.device) -> HiFTGenerator:
        from vllm_omni_token2wav.model_executor.layers.hift import load_hift
        from vllm_omni_token2wav.model_executor.layers.hift.loader import HiFTLoadError

        try:
            return load_hift(path, device=device)
        except HiFTLoadError as exc:
            if (self.model_path / VOCODER_CONFIG).is_file():
                raise HiFTLoadError(
                    f"{exc} [{self.model_path} has {VOCODER_CONFIG}: a minicpmo-utils 1.0.7 directory, whose hift.pt "
                    "is the causal vocoder; build the facade with vocoder=VocoderKind.CAUSAL_HIFT (MiniCPM-o variant "
                    "minicpmo-utils-1.0.7)]"
                ) from exc
            raise

    @property
    def speech_tokenizer(self) -> SpeechTokenizerBackend:
        self.load_models()
        assert self._tokenizer is not None
        return self._tokenizer

    @property
    def flow(self) -> CausalMaskedDiffWithXvec:
        self.load_models()
        assert self._flow is not None
        return self._flow

    @property
    def hift(self) -> HiFTGenerator:
        """The HiFT that vocodes whole utterances (`hift.pt`; with the causal vocoder, `hift_original.pt`)."""
        self.load_models()
        hift = self._hift
        if hift is None:
            with self._lock:
                if self._hift is None:
                    from vllm_omni_token2wav.model_executor.models.token2wav_core.causal_vocoder import (
                        load_whole_utterance_hift,
                    )

                    path = self._whole_hift_path()
                    self._hift = load_whole_utterance_hift(path, device=self.device)
                hift = self._hift
        return hift

    def _whole_hift_path(self) -> Path:
        try:
            return self.asset_path(WHOLE_UTTERANCE_HIFT)
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                f"{exc}. The causal-vocoder layout (minicpmo-utils 1.0.7) vocodes whole utterances with the "
                f"non-causal HiFT in {WHOLE_UTTERANCE_HIFT} (streaming needs only config.yaml + hift.pt); add the "
                "file, or stream the utterance (set_stream_cache + stream)"
            ) from None

    @property
    def stream_vocoder(self) -> StreamVocoder:
        """What turns a stream's mel chunks into audio (see `stream_vocoder.py`)."""
        self.load_models()
        assert self._stream_vocoder is not None
        return self._stream_vocoder

    # ---- prompt path -------------------------------------------------------------------------

    def prepare_prompt(self, prompt_wav: PromptWav, *, with_tokens: bool = False) -> PromptFeatures:
        """Speaker embedding and 24 kHz prompt mel of `prompt_wav`, cached by content (see the base class).

        `with_tokens=True` returns the flow model's prompt: the features plus the prompt's speech
        tokens, with the mel fitted to `2 x tokens` frames (loads the synthesis models on first use).
        """
        return self.speaker_prompt.prepare(prompt_wav, self.speech_tokenizer if with_tokens else None)

    def clear_stream_setup_cache(self) -> None:
        """Forget the post-prompt flow caches (streams already set up keep theirs)."""
        self._setup_cache.clear()

    # ---- synthesis -----------------------------------------------------------------------------

    def speech_token_ids(self, tokens: SpeechTokens, what: str) -> torch.Tensor:
        """`tokens` as a device `(1, n)` long tensor, range-checked against the vocabulary (`what`: the caller)."""
        return speech_token_tensor(tokens, SPEECH_VOCAB_SIZE, self.device, what=what)

    def _generator(self, seed: int | None) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(self.request_seed(seed))

    def __call__(self, tokens: SpeechTokens, prompt_wav: PromptWav, *, seed: int | None = None) -> torch.Tensor:
        """Whole-utterance synthesis: 24 kHz waveform `[1, 480 * 2 * len(tokens)]` float32 on the device.

        `tokens` are 25 Hz speech codes (list / 1-D array / tensor) in [0, 6561); `seed` overrides
        the facade's NSF-noise seed for this call.
        """
        self.load_models()
        ids = self.speech_token_ids(tokens, "token2wav")
        features = self.prepare_prompt(prompt_wav, with_tokens=True)
        return synthesize_utterance(
            self.flow, self.hift, features, ids, n_timesteps=self.n_timesteps, generator=self._generator(seed)
        )

    def set_stream_cache(self, prompt_wav: PromptWav, *, seed: int | None = None) -> Token2WavStream:
        """Start a streaming request in the voice of `prompt_wav`; returns its state (pass it to `stream`).

        The flow's post-prompt cache is computed once per prompt and shared between streams. The
        returned stream also becomes the facade's default stream, used by `stream()` without
        `state=` (the upstream single-stream API) in this thread only: concurrent requests pass
        their own state, and `stream()` without it in another thread raises `StreamInUseError`.
        """
        self.load_models()
        features = self.prepare_prompt(prompt_wav, with_tokens=True)
        caches = open_stream(
            self.flow, self.stream_setup(features), features, self.request_seed(seed), self.stream_vocoder
        )
        state = Token2WavStream.start(features, caches, prompt_wav)
        self._default_stream = DefaultStream(state, threading.current_thread())
        return state

    def _default_state(self) -> Token2WavStream:
        """The default stream, if this thread set it up (else `StreamInUseError`, see `set_stream_cache`)."""
        default = self._default_stream
        if default is None:
            raise RuntimeError("stream(): no stream is set up; call set_stream_cache(prompt_wav) first")
        current = threading.current_thread()
        if default.thread is not current:
            raise StreamInUseError(
                f"stream() without state= in thread {current.name!r}: the default stream was set up by "
                f"set_stream_cache() in thread {default.thread.name!r} and serves that thread only (upstream's "
                "single-stream API: another thread's chunks would run on its state and get its audio); "
                f"{OWN_STREAM_ADVICE}"
            )
        return default.stream

    def stream_setup(self, features: PromptFeatures) -> FlowRowState:
        """The flow state right after the prompt of `features` (computed once per prompt, shared, read-only)."""
        flow = self.flow
        self._check_stream_prompt_length(features, flow)
        key = (
            features.digest,
            features.backend,
            self.n_timesteps,
            self.stream_lookahead,
            self.conformer_trim,
            self.kv_cache_dtype,
        )

        def compute() -> FlowRowState:
            cache = setup_flow_stream(
                flow,
                features,
                n_timesteps=self.n_timesteps,
                lookahead=self.stream_lookahead,
                conformer_trim=self.conformer_trim,
            )
            speaker = project_speaker(flow, features.speaker_embedding)
            return FlowRowState.from_setup(cache, speaker, kv_dtype=self.kv_cache_dtype)

        return self._setup_cache.get_or_compute(key, compute)

    @property
    def window(self) -> torch.Tensor:
        """The cross-fade window (float64 Hamming), built with the models (HiFT vocoder only)."""
        self.load_models()
        if self._window is None:
            raise ValueError(f"{type(self).__name__}: the {self.vocoder_kind.value} vocoder has no cross-fade")
        return self._window

    def stream(
        self,
        tokens: SpeechTokens,
        prompt_wav: PromptWav | None = None,
        last_chunk: bool = False,
        return_waveform: bool = False,
        *,
        state: Token2WavStream | None = None,
    ) -> torch.Tensor | bytes:
        """Synthesize one chunk of a stream; returns its new audio (int16 PCM bytes, or `[1, N]` float32).

        `tokens`: a non-final chunk is its tokens plus `PRE_LOOKAHEAD_TOKENS` lookahead tokens (which
        open the next chunk), at least 4 emitted tokens; the final chunk is just its tokens
        (`last_chunk=True`). `stream_chunks()` yields exactly this from a whole token sequence.
        `prompt_wav`, if given, must be the prompt the stream was set up with (upstream passes it on
        every call). A failing chunk leaves `state` unchanged. A chunk of a stream while another chunk
        of it runs, and a call without `state=` from a thread other than the one that set the default
        stream up, raise `StreamInUseError` before computing anything.
        """
        if state is None:
            state = self._default_state()
        elif not isinstance(state, Token2WavStream):
            raise TypeError(
                f"stream(): state must be the Token2WavStream that set_stream_cache() returned, "
                f"got {type(state).__name__}"
            )
        vocoder = self.stream_vocoder
        if last_chunk and self._flushes_on_empty_final(tokens):
            # minicpmo-utils 1.0.7's Token2wav.stream: an empty final call only flushes the vocoder.
            if prompt_wav is not None:
                self._check_stream_prompt(prompt_wav, state)
            with state.guard.step("stream()"):
                if state.finished:
                    raise RuntimeError("stream(): this stream already had its last chunk; set up a new one")
                speech = vocoder.flush(state.caches.vocoder)
                state.chunks_done += 1
                state.samples_emitted += speech.shape[-1]
                state.finished = True
            return speech if return_waveform else waveform_to_pcm16(speech)
        ids = self.speech_token_ids(tokens, "stream")
        emitted = ids.shape[1] if last_chunk else ids.shape[1] - PRE_LOOKAHEAD_TOKENS
        min_tokens = max(2, -(-vocoder.min_chunk_frames // TOKEN_MEL_RATIO))  # the flow's encoder needs 2
        if emitted < (1 if last_chunk else min_tokens):
            reason = (
                f"the vocoder keeps {vocoder.min_chunk_frames} mel frames"
                if vocoder.min_chunk_frames > 2 * TOKEN_MEL_RATIO
                else "the flow encoder's context"
            )
            raise ValueError(
                f"stream(): {ids.shape[1]} tokens; a non-final chunk needs at least {min_tokens} tokens "
                f"plus {PRE_LOOKAHEAD_TOKENS} lookahead tokens ({reason}), a final chunk at least 1 token"
            )
        if prompt_wav is not None:
            self._check_stream_prompt(prompt_wav, state)
        with state.guard.step("stream()"):
            if state.finished:
                raise RuntimeError("stream(): this stream already had its last chunk; set up a new one")
            result = stream_chunk(self.flow, vocoder, state.caches, ids, last_chunk=last_chunk)
            # Commit only after the whole chunk succeeded: a failure leaves the request resumable.
            state.caches = result.caches
            state.chunks_done += 1
            state.samples_emitted += result.speech.shape[-1]
            state.finished = last_chunk
        return result.speech if return_waveform else waveform_to_pcm16(result.speech)

    def _flushes_on_empty_final(self, tokens: SpeechTokens) -> bool:
        """An empty last chunk flushes the causal vocoder (as minicpmo-utils 1.0.7); HiFT's path rejects it."""
        if self.vocoder_kind is not VocoderKind.CAUSAL_HIFT:
            return False
        if isinstance(tokens, torch.Tensor | np.ndarray):
            return tokens.size == 0 if isinstance(tokens, np.ndarray) else tokens.numel() == 0
        return isinstance(tokens, Sequence) and len(tokens) == 0

    @staticmethod
    def _check_stream_prompt_length(features: PromptFeatures, flow: CausalMaskedDiffWithXvec) -> None:
        """Reject prompts whose estimator cache could not hold a standard chunk after trimming.

        The estimator cache is trimmed to prompt + `CACHE_TAIL_FRAMES` frames and must fit the
        reference's scratch limit together with a 25 + 3 token chunk (56 frames): 844 prompt frames
        (16.9 s) with the shipped limits. Failing here beats failing at the first chunk past 2 s.
        """
        chunk_frames = TOKEN_MEL_RATIO * (CHUNK_TOKENS + PRE_LOOKAHEAD_TOKENS)
        limit = flow.decoder.max_cache_frames - CACHE_TAIL_FRAMES - chunk_frames
        frames = features.prompt_mel.shape[1]
        if frames > limit:
            raise ValueError(
                f"set_stream_cache: the prompt gives {frames} mel frames ({frames / 50:.1f} s) but streaming holds at "
                f"most {limit} ({limit / 50:.1f} s): the flow's {flow.decoder.max_cache_frames}-frame estimator cache "
                f"keeps the prompt + {CACHE_TAIL_FRAMES} frames + a {chunk_frames}-frame chunk; use a shorter prompt"
            )

    def _check_stream_prompt(self, prompt_wav: PromptWav, state: Token2WavStream) -> None:
        """The same object, or the same path, as at set-up passes without decoding; else compare content."""
        ref = state.prompt_ref
        if prompt_wav is ref or (
            isinstance(prompt_wav, str | Path) and isinstance(ref, str | Path) and Path(prompt_wav) == Path(ref)
        ):
            return
        digest, _ = prompt_source(prompt_wav)
        if digest != state.features.digest:
            raise ValueError(
                "stream(): prompt_wav is not the prompt this stream was set up with; "
                "call set_stream_cache(prompt_wav) to start a stream in another voice"
            )


__all__ = [
    "DEFAULT_PROMPT_CACHE_SIZE",
    "DEFAULT_STREAM_SETUP_CACHE_SIZE",
    "PROMPT_MEL_RATE",
    "SPEECH_VOCAB_SIZE",
    "SPEAKER_RATE",
    "STEP_AUDIO2_ASSETS",
    "PromptFeatures",
    "PromptWav",
    "DefaultStream",
    "Token2WavCore",
    "StreamInUseError",
    "Token2WavAssets",
    "Token2WavStream",
]
