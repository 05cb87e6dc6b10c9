# SPDX-License-Identifier: Apache-2.0
"""The data a CosyVoice3 flow stream carries between calls: its state, a call's plan, the last-chunk mode.

`streaming.py` (which plans and starts streams) and `batched.py` (which computes the chunks of many
streams in one launch) both read these types; they live here so neither module imports the other's
types back (the planner calls the kernel, the kernel only sees plain data). Plain data only: no model
is called here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.kv_cache import KVArena


class FinalChunk(enum.Enum):
    """How the last chunk of a stream is computed (see the module docstring)."""

    BLOCK_CAUSAL = "block_causal"
    FULL_ATTENTION = "full_attention"


#: What upstream serves (its last call is `streaming=False`): a user switching from it gets its audio.
DEFAULT_FINAL_CHUNK = FinalChunk.FULL_ATTENTION


@dataclass(frozen=True)
class ChunkPlan:
    """What one call computes, emits and commits, in absolute mel frames (prompt included). Plain data."""

    #: prompt + generated tokens known after this call
    known_tokens: int
    #: frames computed: `[compute_start, compute_end)`; compute_start is the committed length (a chunk boundary)
    compute_start: int
    compute_end: int
    #: frames returned: `[emit_start, emit_end)` (a suffix of the computed ones, never prompt frames)
    emit_start: int
    emit_end: int
    #: frames whose caches are final after this call (a multiple of the chunk size unless final)
    commit_end: int
    #: the token window: ids from `token_start` feed the pre-lookahead layer, `history` of them before
    #: the first computed token; `lookahead_pad` lookahead positions are missing (zeros)
    token_start: int
    token_end: int
    history: int
    lookahead_pad: int
    final: bool

    @property
    def frames(self) -> int:
        return self.compute_end - self.compute_start


@dataclass(frozen=True)
class FullReplay:
    """What `FinalChunk.FULL_ATTENTION` needs to re-run everything at the end: all ids and the prompt mel."""

    ids: torch.Tensor
    prompt_mel: torch.Tensor


@dataclass(frozen=True)
class FlowStreamState:
    """One request's stream. Immutable: `stream_chunk` returns a new state (tensors are never modified,
    the `kv` arena is only appended to past the committed frames, see `kv_cache.py`)."""

    #: the estimator's speaker input `(1, 80)` (normalised, projected)
    spk: torch.Tensor
    #: the noise table `(1, 80, N)` read at absolute frame columns (shared, read-only)
    noise: torch.Tensor
    n_timesteps: int
    prompt_tokens: int
    final_chunk: FinalChunk
    #: prompt + generated token ids received
    known_tokens: int
    #: frames returned so far end here (absolute; prompt frames count as returned)
    emitted_frames: int
    #: frames whose caches are final (a multiple of the chunk size)
    committed_frames: int
    #: ids from position `committed_frames / ratio - history` to `known_tokens`
    window_tokens: torch.Tensor
    #: prompt mel frames `[committed_frames, 2P)` `(1, F, 80)` (cond of frames not committed yet)
    prompt_mel_rest: torch.Tensor
    #: per Euler step, each conv position-embedding layer's input at the 30 frames before
    #: `committed_frames`: `(steps, 2, CFG rows, dim, 30)`; None before the first commit (zeros)
    conv_history: torch.Tensor | None
    kv: KVArena
    replay: FullReplay | None = None
    finished: bool = False
    #: prompt ids not run yet (`start_stream(..., run_prompt=False)`): the first chunk feeds them first
    unfed_prompt: torch.Tensor | None = None
    #: frames reserved for this stream's K/V (0: none): the arena grows geometrically up to this many frames
    #: and no further while a chunk ends within it, so its bytes stay within a memory budget's reservation
    #: (the token2wav stage's `reserve_stream`; docs/design/token2wav_stage.md, "Memory budget")
    kv_reserve_frames: int = 0

    @property
    def generated_tokens(self) -> int:
        """Generated token ids received so far (the prompt's are not counted)."""
        return self.known_tokens if self.unfed_prompt is not None else self.known_tokens - self.prompt_tokens

    @property
    def cache_bytes(self) -> int:
        """Device memory held for this stream (the arena dominates)."""
        small = sum(
            t.nbytes for t in (self.window_tokens, self.prompt_mel_rest, self.conv_history, self.spk) if t is not None
        )
        return self.kv.nbytes + small


__all__ = ["DEFAULT_FINAL_CHUNK", "ChunkPlan", "FinalChunk", "FlowStreamState", "FullReplay"]
