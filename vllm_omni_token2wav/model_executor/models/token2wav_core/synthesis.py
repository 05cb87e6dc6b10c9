# SPDX-License-Identifier: Apache-2.0
"""Speech tokens + prompt features -> 24 kHz waveform: the two synthesis paths of the Token2Wav stage.

The facades (`StepAudio2Token2WavCore` and the wrappers around it) own loading, caching and
request state; this module holds the computation itself, as functions of the loaded models, so it
reads top to bottom like the reference `token2wav.py`:

- `synthesize_utterance`: flow `inference` over [prompt | tokens] (bidirectional), then HiFT over
  the generated mel. `480 * 2 * len(tokens)` samples. `synthesize_utterances` runs several, the flow's
  CFM in one launch (`layers/flow/whole_rows.py`), each equal to its run alone.
- `setup_flow_stream` + `open_stream` + `stream_chunk`: the flow's chunked causal path, then the
  stream's vocoder (`stream_vocoder.StreamVocoder`): by default HiFT re-vocodes the last 8 mel frames
  of the previous chunk with its source samples and cross-fades the first 3840 output samples with
  the samples the previous chunk held back (see `stream.py`); MiniCPM-o's 1.0.7 variant
  streams a bounded causal HiFT instead (`causal_vocoder.py`). `stream_chunk` is one row of the
  batched kernels the serving stage runs for many requests (`cosyvoice2.flow.batched.flow_chunks`,
  `StreamVocoder.vocode`), so there is one streaming implementation.

Both paths take the NSF noise from an explicit generator (or its state), so a request's audio
depends only on its inputs and seed, never on what other requests drew from the global RNG.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from vllm_omni_token2wav.model_executor.layers.flow import (
    CausalMaskedDiffWithXvec,
    ConformerTrim,
    FlowStreamCache,
    Lookahead,
)
from vllm_omni_token2wav.model_executor.layers.flow.batched import (
    FlowChunkRow,
    FlowRowState,
    flow_chunks,
    project_speaker,
)
from vllm_omni_token2wav.model_executor.layers.flow.whole_rows import WholeRow, inference_rows
from vllm_omni_token2wav.model_executor.layers.hift import HiFTGenerator
from vllm_omni_token2wav.model_executor.layers.hift.batched import NoiseState, VocoderState
from vllm_omni_token2wav.model_executor.layers.hift_causal import CausalHiFTStreamState
from vllm_omni_token2wav.model_executor.models.token2wav_core.prompt_features import MEL_BINS, PromptFeatures
from vllm_omni_token2wav.model_executor.models.token2wav_core.stream_vocoder import StreamVocoder, VocoderChunk

SpeechTokens = Sequence[int] | torch.Tensor | np.ndarray


def speech_token_tensor(tokens: SpeechTokens, vocab_size: int, device: torch.device, *, what: str) -> torch.Tensor:
    """`tokens` as a `[1, T]` int32 tensor on `device`, rejecting empty, non-integer and out-of-range ids.

    Accepts a list of ints, a 1-D array/tensor or a `[1, T]` one. The error names the first offending
    position and value, since a bad id usually means the LLM stage emitted a text or control token.
    """
    if isinstance(tokens, torch.Tensor):
        values = tokens.detach()
        if values.dtype in _WIDE_UNSIGNED:  # torch cannot compare these dtypes: check them in numpy
            values = _unsigned_ids(values.cpu().numpy(), vocab_size, what)
    else:
        try:
            array = tokens if isinstance(tokens, np.ndarray) else np.asarray(list(tokens))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{what}: speech tokens must be a sequence of ints, got {tokens!r:.80}") from exc
        if array.dtype.kind not in "biufc":
            raise ValueError(f"{what}: speech tokens must be a sequence of ints, got {tokens!r:.80}")
        # numpy's unsigned ids (uint64 from an LLM's argmax) have no torch comparison: range-check them here.
        values = _unsigned_ids(array, vocab_size, what) if array.dtype.kind == "u" else torch.from_numpy(array.copy())
    if values.dim() == 2 and values.shape[0] == 1:
        values = values[0]
    if values.dim() != 1:
        raise ValueError(f"{what}: speech tokens must be 1-D (or [1, T]), got shape {list(values.shape)}")
    if values.numel() == 0:
        raise ValueError(f"{what}: no speech tokens (empty token list)")
    if values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
        raise ValueError(f"{what}: speech tokens must be integers, got dtype {values.dtype}")
    bad = ((values < 0) | (values >= vocab_size)).nonzero()
    if bad.numel():
        index = int(bad[0, 0])
        raise _out_of_range(what, int(values[index]), index, bad.shape[0], values.numel(), vocab_size)
    return values.to(device=device, dtype=torch.int32, non_blocking=True).reshape(1, -1)  # checked on the host


_WIDE_UNSIGNED = tuple(getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name))


def _out_of_range(what: str, value: int, index: int, count: int, total: int, vocab_size: int) -> ValueError:
    return ValueError(
        f"{what}: speech token {value} at position {index} is outside [0, {vocab_size}) "
        f"({count} of {total} tokens out of range); only 25 Hz speech codes are accepted"
    )


def _unsigned_ids(array: np.ndarray, vocab_size: int, what: str) -> torch.Tensor:
    """Unsigned integer ids as int64, after the range check (which a cast could otherwise wrap around)."""
    flat = array.reshape(-1)
    over = np.flatnonzero(flat >= vocab_size)
    if over.size:
        index = int(over[0])
        raise _out_of_range(what, int(flat[index]), index, over.size, flat.size, vocab_size)
    return torch.from_numpy(array.astype(np.int64))


def _flow_prompt(features: PromptFeatures, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    if features.prompt_tokens is None or features.prompt_token_len is None:
        raise ValueError(f"{what}: prompt features carry no prompt tokens; use prepare_prompt(..., with_tokens=True)")
    return features.prompt_tokens, features.prompt_token_len


@torch.inference_mode()
def synthesize_utterance(
    flow: CausalMaskedDiffWithXvec,
    hift: HiFTGenerator,
    features: PromptFeatures,
    tokens: torch.Tensor,
    *,
    n_timesteps: int,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Waveform `[1, 480 * 2 * T]` float32 of `tokens` `[1, T]` in the prompt's voice (whole utterance)."""
    prompt_tokens, _ = _flow_prompt(features, "synthesize")
    # Batch 1 carries no padding, so each length is its tensor's time dimension: host ints, not the
    # features' device-side lengths (the flow's length checks would read those back, a device wait).
    mel = flow.inference(
        tokens,
        tokens.shape[1],
        prompt_tokens,
        prompt_tokens.shape[1],
        features.prompt_mel,
        features.prompt_mel.shape[1],
        features.speaker_embedding,
        n_timesteps=n_timesteps,
    )
    speech, _ = hift(mel.float(), generator=generator)
    return speech.float()


@dataclass(frozen=True)
class Utterance:
    """One row of `synthesize_utterances`: generated ids `[1, T]` in the prompt's voice, HiFT noise from `generator`."""

    features: PromptFeatures
    tokens: torch.Tensor
    generator: torch.Generator | None


@torch.inference_mode()
def synthesize_utterances(
    flow: CausalMaskedDiffWithXvec, hift: HiFTGenerator, rows: Sequence[Utterance], *, n_timesteps: int
) -> list[torch.Tensor]:
    """`synthesize_utterance` of every row: the flow's CFM of all rows in one launch (`whole_rows.inference_rows`,
    each row's mel equal to its run alone), then HiFT per row with the row's own generator."""
    whole = []
    for row in rows:
        prompt_tokens, _ = _flow_prompt(row.features, "synthesize")
        features = row.features
        whole.append(WholeRow(row.tokens, prompt_tokens, features.prompt_mel, features.speaker_embedding))
    mels = inference_rows(flow, whole, n_timesteps=n_timesteps)
    return [hift(mel.float(), generator=row.generator)[0].float() for mel, row in zip(mels, rows, strict=True)]


@torch.inference_mode()
def setup_flow_stream(
    flow: CausalMaskedDiffWithXvec,
    features: PromptFeatures,
    *,
    n_timesteps: int,
    lookahead: Lookahead,
    conformer_trim: ConformerTrim,
) -> FlowStreamCache:
    """The flow's stream cache after the prompt (immutable: chunks return new caches, so it can be shared)."""
    prompt_tokens, _ = _flow_prompt(features, "set_stream_cache")
    return flow.setup_cache(
        prompt_tokens,
        features.prompt_mel,
        features.speaker_embedding,
        n_timesteps=n_timesteps,
        lookahead=lookahead,
        conformer_trim=conformer_trim,
    )


@dataclass(frozen=True)
class StreamCaches:
    """Everything a stream carries from one chunk to the next (immutable; a chunk returns new caches)."""

    flow: FlowRowState
    vocoder: VocoderState | CausalHiFTStreamState  # whichever the stream's `StreamVocoder` keeps

    def tensors(self) -> list[torch.Tensor]:
        return self.flow.tensors() + self.vocoder.tensors()


@torch.inference_mode()
def open_stream(
    flow: CausalMaskedDiffWithXvec,
    setup: FlowRowState | FlowStreamCache,
    features: PromptFeatures,
    seed: int,
    vocoder: StreamVocoder | None = None,
) -> StreamCaches:
    """A new stream's caches: the (shared) post-prompt flow state and `vocoder`'s fresh state with its seed.

    `vocoder=None` starts the HiFT cross-fade state (`VocoderKind.HIFT`).
    """
    if isinstance(setup, FlowStreamCache):
        setup = FlowRowState.from_setup(setup, project_speaker(flow, features.speaker_embedding))
    if vocoder is None:
        state: object = VocoderState.start(MEL_BINS, features.device, NoiseState(int(seed)))
    else:
        state = vocoder.start(int(seed), features.device)
    assert isinstance(state, VocoderState | CausalHiFTStreamState)
    return StreamCaches(flow=setup, vocoder=state)


@dataclass(frozen=True)
class ChunkResult:
    """One chunk's emitted speech and the caches the next chunk starts from."""

    speech: torch.Tensor
    caches: StreamCaches


@torch.inference_mode()
def stream_chunk(
    flow: CausalMaskedDiffWithXvec,
    vocoder: StreamVocoder,
    caches: StreamCaches,
    tokens: torch.Tensor,
    *,
    last_chunk: bool,
) -> ChunkResult:
    """Compute one chunk from `caches` without modifying them (the caller commits the result)."""
    out = flow_chunks(flow, [FlowChunkRow(tokens.reshape(-1), caches.flow, last_chunk)])[0]
    speech, state = vocoder.vocode([VocoderChunk(out.mel, caches.vocoder, last_chunk)])[0]
    assert isinstance(state, VocoderState | CausalHiFTStreamState)
    return ChunkResult(speech=speech, caches=StreamCaches(flow=out.state, vocoder=state))


__all__ = [
    "ChunkResult",
    "SpeechTokens",
    "StreamCaches",
    "Utterance",
    "open_stream",
    "setup_flow_stream",
    "speech_token_tensor",
    "stream_chunk",
    "synthesize_utterance",
    "synthesize_utterances",
]
