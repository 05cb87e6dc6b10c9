# SPDX-License-Identifier: Apache-2.0
"""The CFM Euler loop over the DiT estimator for the chunks of many streams in one launch.

Equivalent, row by row, to `CausalConditionalCFM.forward_chunk` (batch 1, both CFG halves): each
row's x starts at the fixed noise buffer at its own offset (its cache length), t follows the cosine
schedule, `v = 1.7 v(x | mu, spk, cond) - 0.7 v(x | 0, 0, 0)`, and every block of every step reads
and extends the row's own caches. How the rows share the work (see `ragged.py`):

- the CFG halves are the batch dimension (2), as in the reference; the frames of all rows are
  concatenated along time: `h` is `[2, N, hidden]` with `N = sum T_i` (+ padding frames);
- the timestep embedding and every adaLN modulation are computed once per step (all rows are at
  the same t) and broadcast over the frames;
- in_proj, LayerNorms, q/k/v and output projections, the MLP: once over all frames;
- the conv branch: one causal convolution over the interleaved `[ctx_i | x_i]` (`RaggedConv`);
- attention: per group of consecutive rows with equal (chunk frames, cache frames) one SDPA call
  over `[2 g, heads, T, d]` against `cat([k_new, cached keys])` of each row. The DiT has no
  positional encoding, so keys are only ever each row's own; nothing is padded.

The velocity is evaluated segment by segment (`estimator_segments`: the step cut at its attention
calls), so the same code runs eagerly or, with `graphs`, replays each segment from a device graph
while the attention (which reads and writes the rows' own caches) stays eager in between.

New caches are written directly in their trimmed form (`kv_cache.plan_trim`): per row one
`own` tensor `(n, depth, 2, heads, kept, 2 head_dim)` in the cache dtype; the voice's shared base is
only read. Every tensor is created with an explicit dtype and device (never the process default).
The kernel takes host integers (lengths, offsets) from its caller and never reads a tensor value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vllm_omni_token2wav.model_executor.layers.flow.cfm import CausalConditionalCFM
from vllm_omni_token2wav.model_executor.layers.flow.dit import DiT
from vllm_omni_token2wav.model_executor.layers.flow.estimator_segments import (
    EstimatorGraphs,
    EstimatorSegments,
)
from vllm_omni_token2wav.model_executor.layers.flow.euler import cfg_pair, euler_cfg
from vllm_omni_token2wav.model_executor.layers.flow.kv_cache import (
    TIME_DIM,
    EstimatorKV,
    TrimPlan,
    plan_trim,
)
from vllm_omni_token2wav.model_executor.layers.flow.ragged import RaggedConv, RaggedLayout


@dataclass(frozen=True)
class AttentionGroup:
    """Consecutive rows `[first, first + count)` that all have `frames` chunk frames and `cache` cached frames."""

    first: int
    count: int
    frames: int
    cache: int


def attention_groups(frames: Sequence[int], caches: Sequence[int]) -> list[AttentionGroup]:
    """Runs of consecutive rows with equal (frames, cache); rows with 0 frames are skipped."""
    groups: list[AttentionGroup] = []
    for row, (t, c) in enumerate(zip(frames, caches, strict=True)):
        if t == 0:
            continue
        last = groups[-1] if groups else None
        if last is not None and last.first + last.count == row and (last.frames, last.cache) == (t, c):
            groups[-1] = AttentionGroup(last.first, last.count + 1, t, c)
        else:
            groups.append(AttentionGroup(row, 1, t, c))
    return groups


@dataclass(frozen=True)
class EstimatorRows:
    """Per-row inputs of one launch (all lists in row order)."""

    cnn: Sequence[torch.Tensor]  # (n, depth, 2, 2 hidden, 2) each, or zeros for a fresh stream
    att: Sequence[EstimatorKV]
    prompt_frames: Sequence[int]  # P of each row (trim rule)
    tail_frames: int


class _Launch:
    """Everything of one launch that does not change across blocks and steps."""

    def __init__(
        self, est: DiT, layout: RaggedLayout, rows: EstimatorRows, kv_dtype: torch.dtype, context_rows: int | None
    ) -> None:
        self.layout = layout
        self.rows = rows
        device = rows.att[0].own.device
        self.groups = attention_groups(layout.lengths, [kv.frames for kv in rows.att])
        self.conv = RaggedConv(layout, 3, 2, device, keep_context=2, context_rows=context_rows)
        self.hidden = est.hidden_size
        self.heads = est.num_heads
        self.head_dim = est.head_dim
        self.kv_dtype = kv_dtype
        self.trims: list[TrimPlan] = [
            plan_trim(
                layout.lengths[i],
                kv.own_frames,
                int(kv.base.shape[TIME_DIM]),
                kv.base_from,
                rows.prompt_frames[i],
                rows.tail_frames,
            )
            for i, kv in enumerate(rows.att)
        ]


def _attention(
    q: torch.Tensor,
    kv_new: torch.Tensor,
    launch: _Launch,
    step: int,
    block: int,
    new_own: list[torch.Tensor],
) -> torch.Tensor:
    """Self-attention of all rows for one block of one Euler step; writes the rows' new caches.

    q `[2, H, N, d]` and kv_new `[2, H, N, 2d]` (keys | values, the reference's cache layout) of all
    frames; returns the attention output `[2, H, N, d]` (zeros on padding frames).
    """
    two, heads, n, d = q.shape
    out = q.new_zeros(two, heads, n, d)
    offsets = launch.layout.offsets
    for group in launch.groups:
        g, t, c = group.count, group.frames, group.cache
        start = offsets[group.first]
        span = slice(start, start + g * t)
        if g == 1:
            q_g = q[:, :, span]
            new_g = kv_new[:, :, span].unsqueeze(0)
        else:
            q_g = q[:, :, span].reshape(two, heads, g, t, d).permute(2, 0, 1, 3, 4).reshape(g * two, heads, t, d)
            new_g = kv_new[:, :, span].reshape(two, heads, g, t, 2 * d).permute(2, 0, 1, 3, 4)
        full = q.new_empty(g, two, heads, t + c, 2 * d)
        full[:, :, :, :t] = new_g
        for j in range(g):
            row = group.first + j
            at = t
            for part in launch.rows.att[row].step_block(step, block, q.dtype):
                full[j, :, :, at : at + part.shape[2]] = part
                at += part.shape[2]
            plan = launch.trims[row]
            dst = 0
            for lo, hi in plan.own_ranges:
                new_own[row][step, block, :, :, dst : dst + hi - lo] = full[j, :, :, lo:hi]
                dst += hi - lo
        flat = full.reshape(g * two, heads, t + c, 2 * d)
        o = F.scaled_dot_product_attention(q_g, flat[..., :d], flat[..., d:])
        if g == 1:
            out[:, :, span] = o
        else:
            out[:, :, span] = o.reshape(g, two, heads, t, d).permute(1, 2, 0, 3, 4).reshape(two, heads, g * t, d)
    return out


@torch.inference_mode()
def estimator_chunks(
    cfm: CausalConditionalCFM,
    mu: torch.Tensor,
    spks: torch.Tensor,
    layout: RaggedLayout,
    rows: EstimatorRows,
    *,
    n_timesteps: int,
    kv_dtype: torch.dtype | None = None,
    graphs: EstimatorGraphs | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor], list[EstimatorKV]]:
    """Mel chunks of all rows and their next caches.

    mu `[1, C, layout.total]` (ragged, padding frames last), spks `[rows, C]` (projected speakers).
    Returns (mel `[1, C, layout.total]`, new cnn caches per row, new attention caches per row).
    `kv_dtype` is the storage dtype of the new `own` caches (default: the estimator's dtype).
    `graphs` replays the segments between attention calls from device graphs (`estimator_segments`)
    when `graphs.use_for` accepts the launch's shape (a bucketed frame count, rows it can hold).
    """
    est = cfm.estimator
    n_rows = layout.rows
    if graphs is not None and not graphs.use_for(n_rows, layout.total):
        graphs = None
    if not (len(rows.cnn) == len(rows.att) == len(rows.prompt_frames) == n_rows == spks.shape[0]):
        raise ValueError(
            f"estimator_chunks: {n_rows} rows in the layout but {len(rows.cnn)} cnn caches, {len(rows.att)} attention "
            f"caches, {len(rows.prompt_frames)} prompt lengths and {spks.shape[0]} speakers"
        )
    if mu.dim() != 3 or mu.shape[0] != 1 or mu.shape[2] != layout.total:
        raise ValueError(f"estimator_chunks: mu must be [1, C, {layout.total}], got {tuple(mu.shape)}")
    for i, (cnn, kv) in enumerate(zip(rows.cnn, rows.att, strict=True)):
        if cnn.shape[0] != n_timesteps or kv.own.shape[0] != n_timesteps:
            raise ValueError(
                f"estimator_chunks: row {i} caches have {cnn.shape[0]} / {kv.own.shape[0]} step slots, "
                f"n_timesteps={n_timesteps}; a stream keeps the n_timesteps it was set up with"
            )
    dtype, device = mu.dtype, mu.device
    kv_dtype = kv_dtype or dtype
    capacity = graphs.context_rows if graphs is not None else n_rows
    launch = _Launch(est, layout, rows, kv_dtype, capacity)

    # Noise: each row reads the fixed buffer at its own offset (its logical cache length).
    noise = [cfm.noise(kv.frames, t).to(dtype) for kv, t in zip(rows.att, layout.lengths, strict=True)]
    if layout.pad:
        noise.append(torch.zeros(1, mu.shape[1], layout.pad, dtype=dtype, device=device))
    x = torch.cat(noise, dim=2) * 1.0  # temperature 1.0, as the reference's `noise * temperature`
    # Speaker embedding repeated over each row's frames (zeros on padding frames).
    repeats = torch.tensor(list(layout.lengths), dtype=torch.long).to(device, non_blocking=True)
    spk_frames = torch.repeat_interleave(spks.to(dtype), repeats, dim=0, output_size=layout.frames).T.unsqueeze(0)
    if layout.pad:
        spk_frames = torch.cat([spk_frames, spk_frames.new_zeros(1, spk_frames.shape[1], layout.pad)], dim=2)
    mu_in, spk_in, cond_in = cfg_pair(mu), cfg_pair(spk_frames), cfg_pair(torch.zeros_like(mu))

    cnn_in = torch.stack([cnn.to(dtype) for cnn in rows.cnn], dim=0)  # [rows, n, depth, 2, in + out, 2]
    cnn_out = torch.empty_like(cnn_in)
    if capacity > n_rows:  # the conv plan's fixed row count (graph capture); absent rows read zeros
        cnn_in = torch.cat([cnn_in, cnn_in.new_zeros((capacity - n_rows, *cnn_in.shape[1:]))], dim=0)
    new_own = [
        torch.empty((n_timesteps, *kv.own.shape[1:4], plan.own_frames, kv.own.shape[5]), dtype=kv_dtype, device=device)
        for kv, plan in zip(rows.att, launch.trims, strict=True)
    ]

    segments = graphs.functions() if graphs is not None else EstimatorSegments(est).functions()
    indices = launch.conv.indices.tensors()
    depth = len(segments) - 1

    def velocity(step: int, x_in: torch.Tensor, t_in: torch.Tensor) -> torch.Tensor:
        h, c, m, q, kv = segments[0](x_in, mu_in, spk_in, cond_in, t_in)
        for index in range(depth):
            o = _attention(q, kv, launch, step, index, new_own)
            out = segments[index + 1](h, c, m, o, cnn_in[:, step, index], *indices)
            cnn_out[:, step, index] = out[1][:n_rows]
            if index + 1 < depth:
                h, _, m, q, kv = out
        return out[0]

    if graphs is None:
        x = euler_cfg(x, n_timesteps, cfm.inference_cfg_rate, velocity)
    else:
        with graphs.launch_lock:  # segment outputs are static buffers: one launch at a time
            x = euler_cfg(x, n_timesteps, cfm.inference_cfg_rate, velocity)

    new_att = [
        EstimatorKV(own=own, base=kv.base, base_from=plan.base_from)
        for own, kv, plan in zip(new_own, rows.att, launch.trims, strict=True)
    ]
    return x, [cnn_out[i].clone() for i in range(n_rows)], new_att


__all__ = ["AttentionGroup", "EstimatorRows", "attention_groups", "estimator_chunks"]
