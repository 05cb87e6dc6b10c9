# SPDX-License-Identifier: Apache-2.0
"""Streaming CosyVoice3's flow at constant cost per chunk: per-request caches instead of prefix re-runs.

Upstream (`CosyVoice3Model.tts`) keeps no flow state: every chunk re-runs the flow over prompt +
all tokens so far (`streaming=True, finalize=False`, block-causal mask, noise columns 0..T-1) and keeps
the new frames, so chunk k costs O(k). The re-runs agree on the old frames because nothing a finished
frame depends on ever changes:
- mu at token i depends on tokens i-2 .. i+3 (the pre-lookahead layer), fixed once token i+3 is known;
- noise, cond and RoPE positions depend on the absolute frame index only;
- the conv position embedding is causal (30 frames of left context per conv);
- block-causal attention: a frame sees its own 50-frame chunk and everything before it.
So a finished 50-frame chunk's keys/values, at every Euler step and block, are final. This module
keeps exactly those per request and computes only new frames:

| cache (per stream)  | size                                       | role                        |
|---------------------|--------------------------------------------|-----------------------------|
| `kv` (`KVArena`)    | steps x blocks x 2 CFG x 2 x dim per frame | attention to earlier chunks |
| `conv_history`      | steps x 2 convs x 2 CFG x dim x 30         | conv position embedding     |
| `window_tokens`     | <= 2 + 24 + 3 ids                          | pre-lookahead context       |
| `prompt_mel_rest`   | the prompt frames not yet committed        | cond                        |

A call feeds the tokens received since the last call (`stream_chunk(state, tokens)`). It emits the
mel of every token whose 3 lookahead tokens are known (all of them when `final=True`), i.e. exactly
the frames a prefix re-run ending there would add, and commits the frames that complete a 50-frame
chunk. Frames of an incomplete chunk (only with hops that are not multiples of 25 tokens after the
prompt; never with the upstream schedule, whose first hop pads the prompt to a chunk boundary) are
emitted and recomputed with the next call, as a prefix re-run would. Cost per chunk: every per-frame
op (projections, MLP, convs) on the new frames only; attention reads the cached keys of all earlier
frames, the one term that grows with the history (exact all-left-chunks attention needs it).

The last chunk (`final=True`): upstream's last call runs with `streaming=False`, i.e. full attention
over the whole utterance, which no cache can give. `FinalChunk.BLOCK_CAUSAL` (default) computes the
last chunk like the others from the caches (constant cost, continuous with the emitted chunks, the
same as upstream's own streaming self-test `finalize=True, streaming=True`); `FinalChunk.FULL_ATTENTION`
reproduces upstream exactly with one full re-run of everything (O(N) once, keeps all token ids).

State is a frozen dataclass: a chunk returns a new state and a failed chunk leaves the old one usable.
The kernel (`ChunkPlan` + `_run_chunk`) is one chunk for one request; its per-frame ops take no
request-specific shapes, so a batched stage can later run them ragged across requests.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from vllm_omni.model_executor.models.cosyvoice2.flow.euler import cfg_pair, euler_cfg
from vllm_omni.model_executor.models.cosyvoice2.flow.pre_lookahead import HISTORY
from vllm_omni.model_executor.models.cosyvoice3.flow.config import CosyVoice3FlowConfig
from vllm_omni.model_executor.models.cosyvoice3.flow.kv_cache import KVArena
from vllm_omni.model_executor.models.cosyvoice3.flow.noise import UPSTREAM_NOISE_SEED, check_noise

if TYPE_CHECKING:
    from vllm_omni.model_executor.models.cosyvoice3.flow.flow import CausalMaskedDiffWithDiT

CFG_ROWS = 2


class FinalChunk(enum.Enum):
    """How the last chunk of a stream is computed (see the module docstring)."""

    BLOCK_CAUSAL = "block_causal"
    FULL_ATTENTION = "full_attention"


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


def plan_chunk(
    config: CosyVoice3FlowConfig,
    *,
    known_tokens: int,
    new_tokens: int,
    prompt_tokens: int,
    committed: int,
    emitted: int,
    final: bool,
) -> ChunkPlan:
    """The plan of one call (pure arithmetic, no tensors).

    Emits every token whose lookahead is known (non-final: all but the last `pre_lookahead_len`), from
    where the last call stopped and never prompt frames. Computes from the committed length to the
    emission end; when nothing is emitted (the prompt at stream start, or a chunk still inside its
    lookahead) only complete 50-frame chunks are computed, since incomplete ones would be redone anyway.
    """
    ratio, lookahead, chunk = config.token_mel_ratio, config.pre_lookahead_len, config.static_chunk_size
    known = known_tokens + new_tokens
    ready = known if final else max(known - lookahead, 0)
    ready_frames = ratio * ready
    emit_start = max(emitted, ratio * prompt_tokens)
    emit_end = max(ready_frames, emit_start)
    if final:
        commit_end = emit_end
    else:
        commit_end = max(committed, ready_frames // chunk * chunk)
    compute_end = emit_end if emit_end > emit_start else commit_end
    history = min(HISTORY, committed // ratio)
    token_start = committed // ratio - history
    token_end = min(known, compute_end // ratio + lookahead)
    lookahead_pad = lookahead - (token_end - compute_end // ratio)
    return ChunkPlan(
        known_tokens=known,
        compute_start=committed,
        compute_end=compute_end,
        emit_start=emit_start,
        emit_end=emit_end,
        commit_end=commit_end,
        token_start=token_start,
        token_end=token_end,
        history=history,
        lookahead_pad=lookahead_pad,
        final=final,
    )


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

    @property
    def cache_bytes(self) -> int:
        """Device memory held for this stream (the arena dominates)."""
        small = sum(
            t.nbytes for t in (self.window_tokens, self.prompt_mel_rest, self.conv_history, self.spk) if t is not None
        )
        return self.kv.nbytes + small


def _check_new_tokens(flow: CausalMaskedDiffWithDiT, tokens: torch.Tensor, where: str) -> torch.Tensor:
    # streaming feeds raw generated ids: negative ids are not padding here, so they are errors too
    return flow.tokens(tokens, "tokens", where, clamp_negative=False)


@torch.inference_mode()
def start_stream(
    flow: CausalMaskedDiffWithDiT,
    prompt_token: torch.Tensor,
    prompt_feat: torch.Tensor,
    embedding: torch.Tensor,
    *,
    n_timesteps: int = 10,
    noise_seed: int = UPSTREAM_NOISE_SEED,
    noise: torch.Tensor | None = None,
    final_chunk: FinalChunk = FinalChunk.BLOCK_CAUSAL,
) -> FlowStreamState:
    """Set up a stream for a prompt (tokens `(1, P)`, mel `(1, 2P, 80)` aligned, CAM++ embedding `(1, 192)`).

    Runs the prompt's complete chunks through the estimator once (their caches are final already);
    emits nothing.
    """
    where = "start_stream"
    if n_timesteps < 1:
        raise ValueError(f"flow.{where}: n_timesteps must be >= 1, got {n_timesteps}")
    if not isinstance(final_chunk, FinalChunk):
        raise TypeError(f"flow.{where}: final_chunk must be a FinalChunk, got {final_chunk!r}")
    config = flow.config
    prompt_ids = _check_new_tokens(flow, prompt_token, where)
    prompt_mel = flow.prompt_mel(prompt_feat, prompt_ids.size(1), where)
    # the prompt and at least one generated token must fit the noise table
    table = flow.noise(noise_seed, noise, prompt_mel.size(1) + config.token_mel_ratio, where)
    state = FlowStreamState(
        spk=flow.speaker(embedding, where),
        noise=table,
        n_timesteps=n_timesteps,
        prompt_tokens=prompt_ids.size(1),
        final_chunk=final_chunk,
        known_tokens=0,
        emitted_frames=0,
        committed_frames=0,
        window_tokens=prompt_ids[:, :0],
        prompt_mel_rest=prompt_mel,
        conv_history=None,
        kv=KVArena(
            n_timesteps,
            config.depth,
            CFG_ROWS,
            config.heads,
            config.dim_head,
            capacity=0,
            device=flow.device,
            dtype=flow.dtype,
        ),
        replay=FullReplay(prompt_ids[:, :0], prompt_mel) if final_chunk is FinalChunk.FULL_ATTENTION else None,
    )
    _, state = _advance(flow, state, prompt_ids, final=False, where=where)
    return state


@torch.inference_mode()
def stream_chunk(
    flow: CausalMaskedDiffWithDiT, state: FlowStreamState, tokens: torch.Tensor, *, final: bool = False
) -> tuple[torch.Tensor, FlowStreamState]:
    """Feed the generated tokens `(1, m)` received since the last call; returns (mel `(1, 80, F)`, next state).

    Non-final: mel of all tokens but the last `pre_lookahead_len` not yet returned (F may be 0).
    Final: mel of everything not yet returned; the stream is finished afterwards.
    """
    where = "stream_chunk"
    if not isinstance(state, FlowStreamState):
        raise TypeError(f"flow.{where}: state must be a FlowStreamState from start_stream, got {type(state).__name__}")
    if state.finished:
        raise ValueError(f"flow.{where}: this stream already had its final chunk; start a new stream")
    ids = _check_new_tokens(flow, tokens, where)
    if final and state.known_tokens + ids.size(1) == state.prompt_tokens:
        raise ValueError(f"flow.{where}: final chunk of a stream that never received a generated token")
    if final and state.final_chunk is FinalChunk.FULL_ATTENTION:
        return _full_final(flow, state, ids, where)
    return _advance(flow, state, ids, final=final, where=where)


def _advance(
    flow: CausalMaskedDiffWithDiT, state: FlowStreamState, ids: torch.Tensor, *, final: bool, where: str
) -> tuple[torch.Tensor, FlowStreamState]:
    config = flow.config
    plan = plan_chunk(
        config,
        known_tokens=state.known_tokens,
        new_tokens=ids.size(1),
        prompt_tokens=state.prompt_tokens,
        committed=state.committed_frames,
        emitted=state.emitted_frames,
        final=final,
    )
    check_noise(state.noise, config.output_size, plan.compute_end, where)
    window = torch.cat([state.window_tokens, ids], dim=1)  # ids from (committed / ratio - history)
    replay = state.replay
    if replay is not None:
        replay = FullReplay(torch.cat([replay.ids, ids], dim=1), replay.prompt_mel)
    if plan.frames > 0:
        x, kv, conv_history = _run_chunk(flow, state, plan, window)
        mel = x[:, :, plan.emit_start - plan.compute_start : plan.emit_end - plan.compute_start].float()
    else:
        kv, conv_history = state.kv, state.conv_history
        mel = torch.zeros(1, config.output_size, 0, device=flow.device)
    ratio = config.token_mel_ratio
    history = min(HISTORY, plan.commit_end // ratio)
    keep_from = plan.commit_end // ratio - history - (plan.compute_start // ratio - plan.history)
    next_state = dataclasses.replace(
        state,
        known_tokens=plan.known_tokens,
        emitted_frames=plan.emit_end,
        committed_frames=plan.commit_end,
        window_tokens=window[:, keep_from:],
        prompt_mel_rest=state.prompt_mel_rest[:, plan.commit_end - plan.compute_start :],
        conv_history=conv_history,
        kv=kv,
        replay=replay,
        finished=final,
    )
    return mel, next_state


def _run_chunk(
    flow: CausalMaskedDiffWithDiT, state: FlowStreamState, plan: ChunkPlan, window: torch.Tensor
) -> tuple[torch.Tensor, KVArena, torch.Tensor | None]:
    """The kernel: frames `[compute_start, compute_end)` of one request through every Euler step.

    Returns (x at t=1 `(1, 80, n)`, the arena holding the committed frames, the new conv history).
    """
    config = flow.config
    est = flow.estimator
    start, end, n = plan.compute_start, plan.compute_end, plan.frames
    chunk = config.static_chunk_size
    ids = window[:, : plan.token_end - plan.token_start]
    mu = flow.mu(ids, history=plan.history, lookahead_pad=plan.lookahead_pad)
    cond = torch.zeros_like(mu)
    prompt_part = state.prompt_mel_rest[:, :n]
    cond[:, :, : prompt_part.size(1)] = prompt_part.transpose(1, 2)
    mu_in, spks_in, cond_in = cfg_pair(mu), cfg_pair(state.spk), cfg_pair(cond)
    # the last chunk sizes the arena exactly: nothing will be appended after it
    kv = state.kv.for_chunk(start, end, granule=chunk, limit=end if plan.final else state.noise.size(2))
    commit = plan.commit_end - start
    context = est.conv_context
    histories: list[torch.Tensor] = []

    def velocity(step: int, x_in: torch.Tensor, t_in: torch.Tensor) -> torch.Tensor:
        def attend(block: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            kv.write(step, block, start, k, v)
            outs = []
            for a in range(start, end, chunk):  # start is a chunk boundary: each piece is one chunk
                b = min(a + chunk, end)
                keys, values = kv.read(step, block, b)
                outs.append(F.scaled_dot_product_attention(q[:, :, a - start : b - start], keys, values))
            return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

        previous = None if state.conv_history is None else (state.conv_history[step, 0], state.conv_history[step, 1])
        v, (in1, in2) = est.forward_chunk(
            x_in, mu_in, t_in, spks_in, cond_in, start=start, history=previous, attend=attend
        )
        # each conv's input at the 30 frames before the new committed end (in1/in2 start 30 frames before `start`)
        histories.append(torch.stack([in1[..., commit : commit + context], in2[..., commit : commit + context]]))
        return v

    x = euler_cfg(state.noise[:, :, start:end], state.n_timesteps, config.inference_cfg_rate, velocity)
    kv.commit(plan.commit_end)
    return x, kv, torch.stack(histories)


def _full_final(
    flow: CausalMaskedDiffWithDiT, state: FlowStreamState, ids: torch.Tensor, where: str
) -> tuple[torch.Tensor, FlowStreamState]:
    """Upstream's last call: everything again with full attention (finalize=True), the unreturned frames kept."""
    assert state.replay is not None  # internal invariant: FULL_ATTENTION streams carry their replay
    all_ids = torch.cat([state.replay.ids, ids], dim=1)
    frames = flow.config.token_mel_ratio * all_ids.size(1)
    check_noise(state.noise, flow.config.output_size, frames, where)
    feat = flow.solve(
        all_ids, state.replay.prompt_mel, state.spk, state.noise, state.n_timesteps, streaming=False, finalize=True
    )
    emit_start = max(state.emitted_frames, state.replay.prompt_mel.size(1))
    mel = feat[:, :, emit_start:].float()
    return mel, dataclasses.replace(
        state, known_tokens=all_ids.size(1), emitted_frames=frames, finished=True, replay=None
    )
