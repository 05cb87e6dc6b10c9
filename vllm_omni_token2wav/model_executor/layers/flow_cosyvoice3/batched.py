# SPDX-License-Identifier: Apache-2.0
"""The chunks of several CosyVoice3 flow streams in one launch: per-frame work ragged, attention per stream.

`streaming.py` decides, per stream, which frames a chunk computes (`ChunkPlan`, `state.py`); this module
computes them for many streams at once. Every DiT operation except the conv position embedding and attention is
per frame (projections, LayerNorms, modulation, MLP, RoPE), so the frames of all rows are laid end to
end on one time axis (`cosyvoice2.flow.ragged.RaggedLayout`) and those ops run once over
`[2 CFG, sum n_i, dim]`:

| part                         | across rows                                                         |
|------------------------------|---------------------------------------------------------------------|
| time embedding, modulations  | once per Euler step (every row is at the same t)                    |
| input projection, blocks' per-frame ops, final layer | once over all frames                       |
| RoPE                         | per frame, at each row's absolute positions                         |
| conv position embedding      | per row and 50-frame piece, calls of one fixed shape, over each     |
|                              | row's own `[ctx_i \\| x_i]` (30 frames of left context, `RaggedConv`) |
| attention                    | per row and 50-frame piece, against the row's own `KVArena`          |
| pre-lookahead layer (mu)     | per row (its token window; ~1 % of the work)                        |
| starting noise               | each row's own table, at its absolute frame columns                  |

A launch takes host integers only (plans, lengths) and never reads a tensor value. Padding frames
(`pad_frames`, graph-capture shapes) form a zero pseudo-row that attention never reads and whose
outputs are dropped. Rows must be different streams (distinct arenas): two rows continuing the same
state would write the same scratch frames.

Exactness: one row through this kernel performs exactly the operations of a batch-1 chunk. Several
rows change only the shapes the per-frame GEMMs see; how close that stays to a row run alone is
measured in docs/design/cosyvoice3.md ("Cross-request batching"). The conv position embedding is
NOT one convolution over the interleaved rows: oneDNN's grouped Conv1d (k 31, 16 groups) rounds with
the length of its input on some CPUs (AMD EPYC, AVX2, torch 2.13: up to 8.3e-7 per call between a
row alone and the same row inside a longer sequence; none on the host that first measured this),
which the 2 x depth x steps convolutions of a chunk and the causal HiFT's phase integral turned into
1e-4 in a request's audio, and made a prompt run at set-up differ from the same prompt deferred into
the first chunk. It runs per row in calls of ONE shape: 50 outputs (`static_chunk_size`) from
30 + 50 inputs, pieces aligned to the row's absolute chunk boundaries (`compute_start` is one), a
short last piece right-padded with zeros (causal: no kept output reads them). A frame's embedding
then comes from the same call whatever the launch: alone, batched, or with a deferred prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from vllm_omni_token2wav.model_executor.layers.flow.euler import cfg_pair, euler_cfg
from vllm_omni_token2wav.model_executor.layers.flow.ragged import RaggedConv, RaggedLayout
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.kv_cache import KVArena
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.state import ChunkPlan, FlowStreamState

if TYPE_CHECKING:
    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.flow import CausalMaskedDiffWithDiT


#: `DiT.forward_frames`'s signature: (x, mu, t, spk_frames, cond, *, positions, pos_embed, attend) -> velocity.
FramesForward = Callable[..., Any]


@dataclass(frozen=True)
class ChunkRow:
    """One row of a launch: a stream's state, the plan of its chunk and its token window (ids from
    `plan.token_start`)."""

    state: FlowStreamState
    plan: ChunkPlan
    window: torch.Tensor


@dataclass(frozen=True)
class RowOutput:
    """A row's result: x at t = 1 `(1, 80, plan.frames)`, its arena (committed to `plan.commit_end`) and
    the conv position embedding's inputs at the 30 frames before `plan.commit_end`, per Euler step:
    `(steps, 2 convs, 2 CFG rows, dim, 30)`."""

    x: torch.Tensor
    kv: KVArena
    conv_history: torch.Tensor


def _offsets(lengths: Sequence[int]) -> list[int]:
    out, at = [], 0
    for n in lengths:
        out.append(at)
        at += n
    return out


def _piecewise_conv(
    conv: torch.nn.Conv1d, seq: torch.Tensor, segments: Sequence[tuple[int, int]], context: int, piece: int
) -> torch.Tensor:
    """`conv` (kernel `context + 1`, no padding) over every `(start, length)` segment `[ctx | x]` of `seq`
    `[B, C, L]`, in calls of one fixed shape: each `piece` outputs from `context + piece` inputs (a short
    last piece right-padded with zeros, which no kept output reads). Outputs end to end, `length - context`
    per segment. See the module docstring for why.
    """
    outs = []
    for start, length in segments:
        frames = length - context
        for a in range(0, frames, piece):
            m = min(piece, frames - a)
            window = seq.narrow(2, start + a, context + m)
            if m < piece:
                window = F.pad(window, (0, piece - m))
            outs.append(F.conv1d(window.contiguous(), conv.weight, conv.bias, 1, 0, 1, conv.groups)[:, :, :m])
    # Always a fresh contiguous tensor: the Mish that follows rounds the last (length mod 16) elements of each
    # row of a strided view differently from the same values in a contiguous tensor (its vector loop's tail).
    return torch.cat(outs, dim=2)


def run_rows(
    flow: CausalMaskedDiffWithDiT,
    rows: Sequence[ChunkRow],
    *,
    pad_frames: int = 0,
    forward: FramesForward | None = None,
) -> list[RowOutput]:
    """Frames `[plan.compute_start, plan.compute_end)` of every row through every Euler step, in one launch.

    Every row must compute at least one frame and all rows must share `n_timesteps`. Raises ValueError
    for rows that cannot share a launch (the message says why); nothing is committed then. `forward`
    replaces `estimator.forward_frames` (same signature and values: `graphed.FlowGraphs.forward_frames`
    replays the per-frame segments from device graphs; position embedding and attention stay here).
    """
    if not rows:
        return []
    config, est = flow.config, flow.estimator
    device, dtype = flow.device, flow.dtype
    steps = {r.state.n_timesteps for r in rows}
    if len(steps) != 1:
        raise ValueError(f"flow launch: rows with different n_timesteps {sorted(steps)} cannot share a launch")
    arena_ids = [id(r.state.kv) for r in rows]
    if len(set(arena_ids)) != len(arena_ids):
        raise ValueError("flow launch: two rows continue the same stream state; run them in separate launches")
    if any(r.plan.frames < 1 for r in rows) or pad_frames < 0:
        raise ValueError(
            f"flow launch: every row must compute >= 1 frame (got {[r.plan.frames for r in rows]}) and "
            f"pad_frames must be >= 0 (got {pad_frames})"
        )
    n_timesteps = steps.pop()
    chunk = config.static_chunk_size
    context = est.conv_context
    lengths = [r.plan.frames for r in rows]
    layout = RaggedLayout(tuple(lengths), pad_frames)
    offsets = _offsets(lengths)

    noise, mu, cond, spk, positions, arenas = [], [], [], [], [], []
    for r in rows:
        plan, state = r.plan, r.state
        start, end, n = plan.compute_start, plan.compute_end, plan.frames
        ids = r.window[:, : plan.token_end - plan.token_start]
        row_mu = flow.mu(ids, history=plan.history, lookahead_pad=plan.lookahead_pad)
        row_cond = torch.zeros_like(row_mu)
        prompt_part = state.prompt_mel_rest[:, :n]
        row_cond[:, :, : prompt_part.size(1)] = prompt_part.transpose(1, 2)
        noise.append(state.noise[:, :, start:end])
        mu.append(row_mu)
        cond.append(row_cond)
        spk.append(state.spk[:, :, None].expand(-1, -1, n))
        positions.append(torch.arange(start, end, device=device))
        # the last chunk sizes the arena exactly: nothing will be appended after it; a reservation caps growth
        limit = end if plan.final else state.noise.size(2)
        if end <= state.kv_reserve_frames:
            limit = min(limit, state.kv_reserve_frames)
        arenas.append(state.kv.for_chunk(start, end, granule=chunk, limit=limit))
    if pad_frames:
        zeros = torch.zeros(1, config.output_size, pad_frames, device=device, dtype=dtype)
        for parts in (noise, mu, cond, spk):
            parts.append(zeros)
        positions.append(torch.zeros(pad_frames, dtype=torch.long, device=device))
    x0 = torch.cat(noise, dim=2) if len(noise) > 1 else noise[0]
    mu_in = cfg_pair(torch.cat(mu, dim=2))
    cond_in = cfg_pair(torch.cat(cond, dim=2))
    spk_in = cfg_pair(torch.cat(spk, dim=2))
    frame_positions = torch.cat(positions)

    conv = RaggedConv(layout, context + 1, context, device)
    # each row's segment in the interleaved [ctx_i | x_i] sequence starts at seg_i; keep the 30 conv inputs
    # before its new committed end (seg_i + commit_i .. + 30, commit_i relative to compute_start)
    segments = _offsets([context + n for n in lengths])
    # (start, length) of every segment of the interleaved sequence: the rows, then the padding pseudo-row
    seg_lengths = [context + n for n in lengths] + ([context + pad_frames] if pad_frames else [])
    conv_segments = list(zip(_offsets(seg_lengths), seg_lengths, strict=True))
    keep = [
        seg + r.plan.commit_end - r.plan.compute_start + j
        for seg, r in zip(segments, rows, strict=True)
        for j in range(context)
    ]
    keep_index = torch.tensor(keep, dtype=torch.long).to(device, non_blocking=True)
    cpe = est.input_embed.conv_pos_embed
    zero_context = torch.zeros(2, config.dim, context, device=device, dtype=dtype)
    histories: list[torch.Tensor] = []
    run_frames = est.forward_frames if forward is None else forward

    def left_context(step: int, which: int) -> torch.Tensor:
        parts = [zero_context if r.state.conv_history is None else r.state.conv_history[step, which] for r in rows]
        return torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]

    def velocity(step: int, x_in: torch.Tensor, t_in: torch.Tensor) -> torch.Tensor:
        ctx1, ctx2 = left_context(step, 0), left_context(step, 1)

        def pos_embed(h: torch.Tensor) -> torch.Tensor:
            h_t = h.transpose(1, 2)
            seq1 = conv.interleave(h_t, ctx1)
            y1 = cpe.conv1[1](_piecewise_conv(cpe.conv1[0], seq1, conv_segments, context, chunk))
            seq2 = conv.interleave(y1, ctx2)
            y2 = cpe.conv2[1](_piecewise_conv(cpe.conv2[0], seq2, conv_segments, context, chunk))
            histories.append(torch.stack([seq.index_select(2, keep_index) for seq in (seq1, seq2)]))
            return y2.transpose(1, 2)

        def attend(block: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            outs = []
            piece_dtype = q.dtype
            for r, arena, off, n in zip(rows, arenas, offsets, lengths, strict=True):
                start, end = r.plan.compute_start, r.plan.compute_end
                arena.write(step, block, start, k[:, :, off : off + n], v[:, :, off : off + n])
                for a in range(start, end, chunk):  # start is a chunk boundary: each piece is one chunk
                    b = min(a + chunk, end)
                    keys, values = arena.read(step, block, b)
                    if keys.dtype != piece_dtype:  # a reduced-precision arena (`kv_dtype`): attend in the flow's dtype
                        keys, values = keys.to(piece_dtype), values.to(piece_dtype)
                    piece = q[:, :, off + a - start : off + b - start]
                    outs.append(F.scaled_dot_product_attention(piece, keys, values))
            if pad_frames:
                outs.append(q.new_zeros(q.size(0), q.size(1), pad_frames, q.size(3)))
            return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

        return run_frames(
            x_in, mu_in, t_in, spk_in, cond_in, positions=frame_positions, pos_embed=pos_embed, attend=attend
        )

    x = euler_cfg(x0, n_timesteps, config.inference_cfg_rate, velocity)
    history = torch.stack(histories)  # (steps, 2 convs, 2 CFG rows, dim, rows * 30)
    out = []
    for i, (r, arena, off, n) in enumerate(zip(rows, arenas, offsets, lengths, strict=True)):
        arena.commit(r.plan.commit_end)
        # own copies: a stream state must not keep the whole launch's tensors alive
        own_history = history[..., i * context : (i + 1) * context].clone()
        out.append(RowOutput(x[:, :, off : off + n].clone(), arena, own_history))
    return out


__all__ = ["ChunkRow", "FramesForward", "RowOutput", "run_rows"]
