# SPDX-License-Identifier: Apache-2.0
"""The flow model's streaming chunk for many streams in one launch: `flow_chunks(flow, rows)`.

Per row it computes what `CausalMaskedDiffWithXvec.inference_chunk` computes for that stream alone,
bit for bit on CPU (tested):

1. the conformer encoder (`forward_chunk`) and `encoder_proj`, row by row;
2. `batched_estimator.estimator_chunks`: the CFM Euler loop, both CFG halves, all rows in one
   ragged launch (about 97 % of the flow's arithmetic at the shipped geometry).

Why the encoder runs per row (measured, torch 2.13 CPU): its relative-position attention depends
on each row's key length (`rel_shift`), and CPU kernels round differently with the shape of the
whole launch: a GEMM rounds the last `M mod 4` rows of a matrix differently from the others (a
chunk's 25 or 28 token rows, or a last chunk's few, rarely make M a multiple of 4), and a batch-1
Conv1d picks another algorithm below ~11 (hidden 64) to ~38 (hidden 512) output frames. Batched,
those 1-ulp differences in the mel reach 1e-5 in the audio through HiFT's F0 -> phase integral,
the budget of "each request equals its solo run". The estimator has none of these: its GEMMs see
`M = 2 x 2 x tokens` rows (a multiple of 4) per row, its convolutions have batch 2 (the CFG
halves), and SDPA results do not depend on the batch.

A stream's state between chunks is a `FlowRowState` (immutable; every launch returns new ones):
the conformer caches as in `FlowStreamCache`, the estimator attention cache as an `EstimatorKV`
(own frames + the voice's shared post-prompt frames, see `kv_cache.py`). `FlowRowState.from_setup`
turns the (shared) result of `setup_cache` into a stream's first state.

Shapes a launch may be given: any mix of chunk lengths, first/middle/last chunks, voices and cache
lengths, as long as all rows share the estimator's `n_timesteps` and dtypes (the planner groups by
`FlowRowState.launch_key`). `pad_frames` appends dummy frames to the estimator's ragged axis so a
launch can run at a bucketed length (graph capture); they never reach a row. `check_chunk` holds
every limit that can be checked before launch (token ids, chunk length, positional table, noise
buffer), so one bad request is rejected alone instead of failing its launch.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

import torch

from vllm_omni_token2wav.model_executor.layers.flow.batched_estimator import EstimatorRows, estimator_chunks
from vllm_omni_token2wav.model_executor.layers.flow.encoder import REL_POS_MAX_LEN
from vllm_omni_token2wav.model_executor.layers.flow.estimator_segments import EstimatorGraphs
from vllm_omni_token2wav.model_executor.layers.flow.flow import CausalMaskedDiffWithXvec
from vllm_omni_token2wav.model_executor.layers.flow.kv_cache import EstimatorKV
from vllm_omni_token2wav.model_executor.layers.flow.ragged import RaggedLayout
from vllm_omni_token2wav.model_executor.layers.flow.streaming import (
    CACHE_TAIL_FRAMES,
    ConformerTrim,
    FlowStreamCache,
    trim_conformer_cache,
)


def project_speaker(flow: CausalMaskedDiffWithXvec, embedding: torch.Tensor) -> torch.Tensor:
    """The estimator's speaker input `[1, 80]` for a CAM++ embedding `[1, 192]` (L2-normalised, affine).

    Computed once per stream with batch 1, as the reference computes it for every chunk: a batched
    `Linear` over several speakers rounds differently (GEMM vs GEMV), so rows would not be bit-equal
    to their solo runs.
    """
    return flow.project_speaker(embedding, "stream setup")


@dataclass(frozen=True)
class FlowRowState:
    """One stream's flow conditioning and caches between chunks (never modified; launches return new ones)."""

    speaker: torch.Tensor  # [1, 80]: `project_speaker` of the stream's voice
    conformer_cnn: torch.Tensor  # (1, C, 2 + 2 stride)
    conformer_att: torch.Tensor  # (blocks + up_blocks, 1, heads, 2 t, 2 d_k), token-rate layers tiled x2
    estimator_cnn: torch.Tensor  # (n, depth, 2, 2 hidden, 2)
    estimator_att: EstimatorKV
    prompt_frames: int
    n_timesteps: int
    conformer_trim: ConformerTrim = ConformerTrim.NONE
    tail_frames: int = CACHE_TAIL_FRAMES

    @classmethod
    def from_setup(
        cls, cache: FlowStreamCache, speaker: torch.Tensor, *, kv_dtype: torch.dtype | None = None
    ) -> FlowRowState:
        """A stream's first state from the (shared, immutable) result of `setup_cache` and its projected speaker."""
        return cls(
            speaker=speaker,
            conformer_cnn=cache.conformer_cnn_cache,
            conformer_att=cache.conformer_att_cache,
            estimator_cnn=cache.estimator_cnn_cache,
            estimator_att=EstimatorKV.from_setup(cache.estimator_att_cache, kv_dtype),
            prompt_frames=cache.prompt_frames,
            n_timesteps=cache.n_timesteps,
            conformer_trim=cache.conformer_trim,
            tail_frames=cache.tail_frames,
        )

    def to_stream_cache(self) -> FlowStreamCache:
        """The reference layout (materialised estimator cache), for `flow.inference_chunk` and tests."""
        return FlowStreamCache(
            conformer_cnn_cache=self.conformer_cnn,
            conformer_att_cache=self.conformer_att,
            estimator_cnn_cache=self.estimator_cnn,
            estimator_att_cache=self.estimator_att.materialize(),
            prompt_frames=self.prompt_frames,
            n_timesteps=self.n_timesteps,
            conformer_trim=self.conformer_trim,
            tail_frames=self.tail_frames,
        )

    @property
    def estimator_frames(self) -> int:
        return self.estimator_att.frames

    @property
    def conformer_frames(self) -> int:
        return int(self.conformer_att.shape[3])

    @property
    def launch_key(self) -> Hashable:
        """Rows may share a launch when these agree (step count and the dtypes the kernels see)."""
        return (self.n_timesteps, self.estimator_cnn.dtype, self.estimator_att.dtype, self.conformer_att.device)

    def tensors(self) -> list[torch.Tensor]:
        kv = self.estimator_att
        return [self.speaker, self.conformer_cnn, self.conformer_att, self.estimator_cnn, kv.own, kv.base]


@dataclass(frozen=True)
class FlowChunkRow:
    """One stream's chunk: `tokens` [T] int64 (its 3 lookahead tokens included unless `last`) and its state."""

    tokens: torch.Tensor
    state: FlowRowState
    last: bool


@dataclass(frozen=True)
class FlowChunkOut:
    mel: torch.Tensor  # [1, 80, 2 * emitted tokens] in the flow's dtype
    state: FlowRowState


def emitted_tokens(tokens: int, last: bool, lookahead: int) -> int:
    """Tokens a chunk turns into mel: all of a last chunk, all but the lookahead of any other."""
    return tokens if last else tokens - lookahead


def check_chunk(flow: CausalMaskedDiffWithXvec, state: FlowRowState, tokens: Sequence[int], last: bool) -> None:
    """Raise ValueError naming the limit if this chunk cannot run from `state` (checked on host ints).

    Limits: ids in [0, vocab); a non-final chunk emits >= 2 tokens after its lookahead (the encoder's
    conv context), a final one >= 1; the conformer's 5000-position table holds the row's cache plus
    the chunk (Step-Audio2 streams without conformer trimming reach it after ~94 s); the noise
    buffer covers the row's estimator offset plus its frames.
    """
    lookahead = flow.pre_lookahead_len
    n = len(tokens)
    emitted = emitted_tokens(n, last, lookahead)
    if emitted < (1 if last else 2):
        raise ValueError(
            f"{n} tokens: a non-final chunk needs at least 2 tokens plus {lookahead} lookahead tokens, "
            "a final chunk at least 1 token"
        )
    bad = [(i, t) for i, t in enumerate(tokens) if not 0 <= t < flow.vocab_size]
    if bad:
        i, t = bad[0]
        raise ValueError(
            f"speech token {t} at position {i} is outside [0, {flow.vocab_size}) ({len(bad)} of {n} tokens out of "
            "range); only 25 Hz speech codes are accepted"
        )
    stride = flow.up_rate
    token_offset = state.conformer_frames // stride
    positions = (token_offset + emitted) * stride  # the mel-rate layers see the most positions
    if positions > REL_POS_MAX_LEN:
        raise ValueError(
            f"the conformer needs {positions} relative positions for this chunk (cache {state.conformer_frames} "
            f"frames + {stride * emitted}) but its table holds {REL_POS_MAX_LEN}: the stream is too long without "
            "conformer-cache trimming (ConformerTrim.PROMPT_PLUS_TAIL or PER_RATE) or the chunk is too long; split it"
        )
    noise = flow.decoder.rand_noise.shape[2]
    end = state.estimator_frames + stride * emitted
    if end > noise:
        raise ValueError(
            f"the chunk reads noise frames {state.estimator_frames}..{end} but the CFM noise buffer holds {noise}"
        )


@torch.inference_mode()
def flow_chunks(
    flow: CausalMaskedDiffWithXvec,
    rows: Sequence[FlowChunkRow],
    *,
    pad_frames: int = 0,
    kv_dtype: torch.dtype | None = None,
    graphs: EstimatorGraphs | None = None,
) -> list[FlowChunkOut]:
    """The chunk of every row in one launch (see the module docstring). Rows must share `launch_key`.

    `graphs` replays the estimator's segments from device graphs (`estimator_segments`); the
    conformer encoder runs eagerly per row either way.
    """
    if not rows:
        return []
    keys = {row.state.launch_key for row in rows}
    if len(keys) > 1:
        raise ValueError(f"flow_chunks: rows of one launch must share n_timesteps, dtypes and device, got {keys}")
    device = flow.device
    encoded = []
    for row in rows:
        tokens = row.tokens.reshape(1, -1).to(device=device, dtype=torch.long)
        h, cnn, att = flow.encoder.forward_chunk(
            flow.input_embedding(tokens), row.last, row.state.conformer_cnn, row.state.conformer_att
        )
        encoded.append((flow.encoder_proj(h), cnn, att))
    layout = RaggedLayout(tuple(int(h.shape[1]) for h, _, _ in encoded), pad_frames)
    hidden = torch.cat([h for h, _, _ in encoded], dim=1)  # [1, M, 80]
    if pad_frames:
        hidden = torch.cat([hidden, hidden.new_zeros(1, pad_frames, hidden.shape[2])], dim=1)
    spks = torch.cat([row.state.speaker.reshape(1, -1) for row in rows]).to(device=device, dtype=flow.dtype)
    n_timesteps = rows[0].state.n_timesteps
    mel, est_cnn, est_att = estimator_chunks(
        flow.decoder,
        hidden.transpose(1, 2).contiguous(),
        spks,
        layout,
        EstimatorRows(
            cnn=[row.state.estimator_cnn for row in rows],
            att=[row.state.estimator_att for row in rows],
            prompt_frames=[row.state.prompt_frames for row in rows],
            tail_frames=rows[0].state.tail_frames,
        ),
        n_timesteps=n_timesteps,
        kv_dtype=kv_dtype or rows[0].state.estimator_att.dtype,
        graphs=graphs,
    )
    out = []
    for i, row in enumerate(rows):
        state = row.state
        _, cnn, att = encoded[i]
        att = trim_conformer_cache(
            att,
            state.conformer_trim,
            state.prompt_frames,
            state.tail_frames,
            token_layers=len(flow.encoder.encoders),
            stride=flow.up_rate,
        )
        new_state = replace(
            state,
            conformer_cnn=cnn,
            conformer_att=att,
            estimator_cnn=est_cnn[i],
            estimator_att=est_att[i],
        )
        span = layout.span(i)
        out.append(FlowChunkOut(mel=mel[:, :, span], state=new_state))
    return out


__all__ = [
    "FlowChunkOut",
    "FlowChunkRow",
    "FlowRowState",
    "check_chunk",
    "emitted_tokens",
    "flow_chunks",
    "project_speaker",
]
