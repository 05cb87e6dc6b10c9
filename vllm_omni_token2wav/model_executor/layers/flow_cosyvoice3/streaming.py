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
over the whole utterance, which no cache can give. `FinalChunk.FULL_ATTENTION` (default,
`DEFAULT_FINAL_CHUNK`) reproduces upstream's served audio exactly with one full re-run of everything
(O(N) once per utterance, keeps all token ids); `FinalChunk.BLOCK_CAUSAL` computes the last chunk like
the others from the caches (constant cost, continuous with the emitted chunks, the same as upstream's
own streaming self-test `finalize=True, streaming=True`), and differs from upstream in the last chunk.

State is a frozen dataclass (`state.py`, with the plan of a call): a chunk returns a new state and a failed
chunk leaves the old one usable.
A call is planned per stream (`ChunkPlan`) and computed by the kernel of `batched.py`, which runs the
chunks of one or several streams in one launch (`stream_chunks`); `stream_chunk` is one row of it.
`start_stream(..., run_prompt=False)` defers the prompt's frames to the first chunk, so a serving stage
computes them inside that chunk's (batched) launch instead of when the request is admitted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from vllm_omni_token2wav.model_executor.layers.flow.pre_lookahead import HISTORY
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.batched import (
    ChunkRow,
    FramesForward,
    RowOutput,
    run_rows,
)
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.config import CosyVoice3FlowConfig
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.kv_cache import KVArena
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.noise import UPSTREAM_NOISE_SEED, check_noise
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.state import (
    DEFAULT_FINAL_CHUNK,
    ChunkPlan,
    FinalChunk,
    FlowStreamState,
    FullReplay,
)

if TYPE_CHECKING:
    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.flow import CausalMaskedDiffWithDiT

CFG_ROWS = 2


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
    final_chunk: FinalChunk = DEFAULT_FINAL_CHUNK,
    run_prompt: bool = True,
    kv_dtype: torch.dtype | None = None,
) -> FlowStreamState:
    """Set up a stream for a prompt (tokens `(1, P)`, mel `(1, 2P, 80)` aligned, CAM++ embedding `(1, 192)`).

    `run_prompt=True` runs the prompt's complete chunks through the estimator now (their caches are final
    already); `False` only checks the inputs and leaves the prompt to the first chunk (same results, the
    work moves into that chunk's launch). Emits nothing. `kv_dtype` stores the K/V arena in another dtype
    (bf16 / fp16 halve it; attention still runs in the flow's dtype); None: the flow's dtype.
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
            dtype=flow.dtype if kv_dtype is None else kv_dtype,
        ),
        replay=FullReplay(prompt_ids[:, :0], prompt_mel) if final_chunk is FinalChunk.FULL_ATTENTION else None,
        unfed_prompt=prompt_ids,
    )
    if run_prompt:
        ((_, state),) = _run(flow, [_prepare(flow, state, prompt_ids[:, :0], final=False, where=where)], 0)
    return state


@torch.inference_mode()
def stream_chunk(
    flow: CausalMaskedDiffWithDiT, state: FlowStreamState, tokens: torch.Tensor, *, final: bool = False
) -> tuple[torch.Tensor, FlowStreamState]:
    """Feed the generated tokens `(1, m)` received since the last call; returns (mel `(1, 80, F)`, next state).

    Non-final: mel of all tokens but the last `pre_lookahead_len` not yet returned (F may be 0).
    Final: mel of everything not yet returned; the stream is finished afterwards.
    """
    return stream_chunks(flow, [(state, tokens, final)])[0]


@torch.inference_mode()
def stream_chunks(
    flow: CausalMaskedDiffWithDiT,
    rows: Sequence[tuple[FlowStreamState, torch.Tensor, bool]],
    *,
    pad_frames: int = 0,
    forward: FramesForward | None = None,
) -> list[tuple[torch.Tensor, FlowStreamState]]:
    """`stream_chunk(state, tokens, final=final)` of several streams in one launch (`batched.run_rows`).

    Rows are `(state, tokens, final)` of different streams sharing `n_timesteps`; results come back in
    row order. Every row is checked before anything runs; `pad_frames` pads the launch's frame axis
    (graph-capture shapes, see `batched.py`); `forward` replaces the estimator's `forward_frames` in the
    launch (`graphed.FlowGraphs`). `FinalChunk.FULL_ATTENTION` last chunks re-run their whole utterance
    one by one (eagerly).
    """
    where = "stream_chunk"
    prepared: list[_Prepared | None] = []
    results: list[tuple[torch.Tensor, FlowStreamState] | None] = [None] * len(rows)
    for i, (state, tokens, final) in enumerate(rows):
        if not isinstance(state, FlowStreamState):
            raise TypeError(
                f"flow.{where}: state must be a FlowStreamState from start_stream, got {type(state).__name__}"
            )
        if state.finished:
            raise ValueError(f"flow.{where}: this stream already had its final chunk; start a new stream")
        ids = _check_new_tokens(flow, tokens, where)
        if final and state.generated_tokens + ids.size(1) == 0:
            raise ValueError(f"flow.{where}: final chunk of a stream that never received a generated token")
        if final and state.final_chunk is FinalChunk.FULL_ATTENTION:
            prepared.append(None)
            results[i] = _full_final(flow, state, ids, where)
        else:
            prepared.append(_prepare(flow, state, ids, final=final, where=where))
    todo = [p for p in prepared if p is not None]
    done = iter(_run(flow, todo, pad_frames, forward))
    return [result if result is not None else next(done) for result in results]


@dataclass(frozen=True)
class _Prepared:
    """A checked call: its plan, its token window and the next replay record (nothing computed yet)."""

    state: FlowStreamState
    plan: ChunkPlan
    window: torch.Tensor
    replay: FullReplay | None


def _prepare(
    flow: CausalMaskedDiffWithDiT, state: FlowStreamState, ids: torch.Tensor, *, final: bool, where: str
) -> _Prepared:
    if state.unfed_prompt is not None:
        ids = torch.cat([state.unfed_prompt, ids], dim=1)
    plan = plan_chunk(
        flow.config,
        known_tokens=state.known_tokens,
        new_tokens=ids.size(1),
        prompt_tokens=state.prompt_tokens,
        committed=state.committed_frames,
        emitted=state.emitted_frames,
        final=final,
    )
    check_noise(state.noise, flow.config.output_size, plan.compute_end, where)
    window = torch.cat([state.window_tokens, ids], dim=1)  # ids from (committed / ratio - history)
    replay = state.replay
    if replay is not None:
        replay = FullReplay(torch.cat([replay.ids, ids], dim=1), replay.prompt_mel)
    return _Prepared(state, plan, window, replay)


def _run(
    flow: CausalMaskedDiffWithDiT,
    prepared: Sequence[_Prepared],
    pad_frames: int,
    forward: FramesForward | None = None,
) -> list[tuple[torch.Tensor, FlowStreamState]]:
    """Compute the prepared calls (those with frames in one launch) and build their next states."""
    computing = [p for p in prepared if p.plan.frames > 0]
    launch = [ChunkRow(p.state, p.plan, p.window) for p in computing]
    outputs = iter(run_rows(flow, launch, pad_frames=pad_frames, forward=forward))
    return [_finish(flow, p, next(outputs) if p.plan.frames > 0 else None) for p in prepared]


def _finish(
    flow: CausalMaskedDiffWithDiT, prepared: _Prepared, output: RowOutput | None
) -> tuple[torch.Tensor, FlowStreamState]:
    state, plan, window = prepared.state, prepared.plan, prepared.window
    config = flow.config
    if output is not None:
        kv, conv_history = output.kv, output.conv_history
        mel = output.x[:, :, plan.emit_start - plan.compute_start : plan.emit_end - plan.compute_start].float()
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
        replay=prepared.replay,
        finished=plan.final,
        unfed_prompt=None,
    )
    return mel, next_state


def _full_final(
    flow: CausalMaskedDiffWithDiT, state: FlowStreamState, ids: torch.Tensor, where: str
) -> tuple[torch.Tensor, FlowStreamState]:
    """Upstream's last call: everything again with full attention (finalize=True), the unreturned frames kept."""
    assert state.replay is not None  # internal invariant: FULL_ATTENTION streams carry their replay
    if state.unfed_prompt is not None:
        ids = torch.cat([state.unfed_prompt, ids], dim=1)
    all_ids = torch.cat([state.replay.ids, ids], dim=1)
    frames = flow.config.token_mel_ratio * all_ids.size(1)
    check_noise(state.noise, flow.config.output_size, frames, where)
    feat = flow.solve(
        all_ids, state.replay.prompt_mel, state.spk, state.noise, state.n_timesteps, streaming=False, finalize=True
    )
    emit_start = max(state.emitted_frames, state.replay.prompt_mel.size(1))
    mel = feat[:, :, emit_start:].float()
    return mel, dataclasses.replace(
        state, known_tokens=all_ids.size(1), emitted_frames=frames, finished=True, replay=None, unfed_prompt=None
    )
