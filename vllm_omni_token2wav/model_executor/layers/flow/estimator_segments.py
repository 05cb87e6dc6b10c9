# SPDX-License-Identifier: Apache-2.0
"""One velocity evaluation of the batched DiT cut at its attention calls, so the pieces can be captured.

A step of the batched estimator (`batched_estimator.estimator_chunks`) does per block: adaLN
modulation, norm, q/k/v; attention of every row against its own cache (per-row tensors of every
size, owned by each stream: no device graph can hold them); output projection, residual, the
ragged causal conv branch, the MLP. Everything except the attention works on launch-shaped
tensors (`[2, N, hidden]`, N the launch's bucketed frames) with host integers only, so cutting
at the attention calls leaves `depth + 1` segments a graph can capture, as vLLM captures a
decoder piecewise around its attention:

| segment          | computes                                                    | returns                      |
|------------------|-------------------------------------------------------------|------------------------------|
| 0                | in_proj of `[x, mu, spk, cond]`, timestep embedding, pre(0)  | h, c, m_0, q_0, kv_0         |
| i (1..depth-1)   | post(i - 1), pre(i)                                          | h, ctx_{i-1}, m_i, q_i, kv_i |
| depth            | post(depth - 1), final layer                                 | velocity, ctx_{depth-1}      |

pre(i) = adaLN(c) (`m`, all nine modulations in one tensor), modulate(norm1(h)), q and
`kv = cat([k, v])` (the cache layout); post(i) = `h + g_msa * out_proj(o)`, the conv branch over the
rows' conv contexts (in: `ctx` `[R, 2, C, 2]`, out: the next contexts), `+ g_conv * conv`,
`+ g_mlp * mlp`. The conv branch's gather plan comes in as tensors (`ragged.ConvIndices`) built
with `context_rows=R` (fixed shapes), so a segment's tensor shapes depend only on N and R: one
graph per bucketed N serves every mix of rows and chunk lengths.

`EstimatorSegments` are the eager functions (the kernel runs them directly when nothing is
captured: same ops, so a replayed launch gives the eager launch's values). `EstimatorGraphs`
wraps each in a `DeviceGraphRunner` (`flow-estimator.seg00` ... `segNN`); outputs are the runners'
static tensors (`clone_outputs=False`): the kernel consumes each before the same segment replays
again (next Euler step), and one launch at a time holds `launch_lock`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor import buckets
from vllm_omni_token2wav.model_executor.layers.flow.dit import DiT, DiTBlock, modulate
from vllm_omni_token2wav.model_executor.layers.flow.ragged import ConvIndices, ragged_conv1d
from vllm_omni_token2wav.platforms.device import DeviceSpec
from vllm_omni_token2wav.platforms.device_graphs import FROM_PLATFORM, DeviceGraphRunner, GraphCounters
from vllm_omni_token2wav.platforms.graph_api import DeviceGraphApi

logger = init_logger(__name__)

Segment = Callable[..., tuple[torch.Tensor, ...]]


def pre_attention(block: DiTBlock, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(m, q, kv) of one block: its nine modulations, the queries and `cat([k, v], 3)` of all frames."""
    m = block.adaLN_modulation(c)
    s_msa, sc_msa = m.chunk(9, -1)[:2]
    q, k, v = block.attn.project_qkv(modulate(block.norm1(h), s_msa, sc_msa))
    return m, q, torch.cat([k, v], dim=3)


def conv_branch(
    block: DiTBlock, x: torch.Tensor, ctx: torch.Tensor, indices: ConvIndices
) -> tuple[torch.Tensor, torch.Tensor]:
    """`CausalConvBlock.forward_chunk` of all rows: x `[2, N, C]`, ctx `[R, 2, in + out, 2]` -> (y, next ctx)."""
    conv_block = block.conv
    c_in, c_out = conv_block.in_channels, conv_block.out_channels
    two, rows = x.shape[0], ctx.shape[0]
    # A row's context is [2, C, 2]; the ragged convolution takes them side by side: [2, C, rows * 2].
    by_row = ctx.permute(1, 2, 0, 3)
    ctx1 = by_row[:, :c_in].reshape(two, c_in, rows * 2)
    ctx2 = by_row[:, c_in:].reshape(two, c_out, rows * 2)
    y, new1 = ragged_conv1d(cast(torch.nn.Conv1d, conv_block.block[1]), x.transpose(1, 2), ctx1, indices)
    y = conv_block.block[2:6](y)
    y, new2 = ragged_conv1d(cast(torch.nn.Conv1d, conv_block.block[6]), y, ctx2, indices)
    new = torch.cat([new1, new2], dim=1).reshape(two, c_in + c_out, rows, 2).permute(2, 0, 1, 3)
    return y.transpose(1, 2), new


def post_attention(
    block: DiTBlock,
    h: torch.Tensor,
    m: torch.Tensor,
    o: torch.Tensor,
    ctx: torch.Tensor,
    indices: ConvIndices,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, next conv contexts) after one block, given its attention output `o` `[2, heads, N, head_dim]`."""
    _, _, g_msa, s_mlp, sc_mlp, g_mlp, s_conv, sc_conv, g_conv = m.chunk(9, -1)
    h = h + g_msa * block.attn.project_out(o)
    y, new_ctx = conv_branch(block, modulate(block.norm3(h), s_conv, sc_conv), ctx, indices)
    h = h + g_conv * y
    return h + g_mlp * block.mlp(modulate(block.norm2(h), s_mlp, sc_mlp)), new_ctx


class EstimatorSegments:
    """The `depth + 1` eager segment functions of one DiT (see the module table)."""

    def __init__(self, estimator: DiT) -> None:
        self.estimator = estimator
        self.blocks = [cast(DiTBlock, b) for b in estimator.blocks]

    @property
    def count(self) -> int:
        return len(self.blocks) + 1

    def first(
        self, x: torch.Tensor, mu: torch.Tensor, spk: torch.Tensor, cond: torch.Tensor, t: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        est = self.estimator
        h_in = torch.cat([x, mu, spk, cond], dim=1)
        if h_in.shape[1] != est.in_channels:
            raise ValueError(f"DiT: concatenated input has {h_in.shape[1]} channels, expected {est.in_channels}")
        h = est.in_proj(h_in.transpose(1, 2))
        c = est.t_embedder(t).unsqueeze(1)
        return (h, c, *pre_attention(self.blocks[0], h, c))

    def middle(self, index: int) -> Segment:
        """Segment `index` (1..depth-1): post(index - 1) then pre(index)."""
        done, following = self.blocks[index - 1], self.blocks[index]

        def segment(
            h: torch.Tensor,
            c: torch.Tensor,
            m: torch.Tensor,
            o: torch.Tensor,
            ctx: torch.Tensor,
            interleave: torch.Tensor,
            outputs: torch.Tensor,
            contexts: torch.Tensor,
        ) -> tuple[torch.Tensor, ...]:
            h, new_ctx = post_attention(done, h, m, o, ctx, ConvIndices(interleave, outputs, contexts))
            return (h, new_ctx, *pre_attention(following, h, c))

        return segment

    def last(
        self,
        h: torch.Tensor,
        c: torch.Tensor,
        m: torch.Tensor,
        o: torch.Tensor,
        ctx: torch.Tensor,
        interleave: torch.Tensor,
        outputs: torch.Tensor,
        contexts: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, new_ctx = post_attention(self.blocks[-1], h, m, o, ctx, ConvIndices(interleave, outputs, contexts))
        return self.estimator.final_layer(h, c).transpose(1, 2), new_ctx

    def functions(self) -> list[Segment]:
        return [self.first, *(self.middle(i) for i in range(1, len(self.blocks))), self.last]


class EstimatorGraphs:
    """The segments of one DiT, each replayed from device graphs keyed by its input shapes.

    `context_rows` is the row capacity of every launch's conv plan (the stage's `max_num_seqs`).
    Only launches whose frames are a stage bucket (`buckets.stage_frame_buckets()`) and whose rows
    fit `context_rows` replay graphs (`use_for`); others (a whole reply of several seconds, more
    rows than planned) run eagerly and are counted, so a one-off shape never costs a capture.
    Runner options (`enabled`, `max_graphs`, ...) apply to all segments; `graph_api` defaults to
    the serving platform's (tests pass a fake).
    """

    def __init__(
        self,
        estimator: DiT,
        *,
        context_rows: int,
        device: DeviceSpec = None,
        graph_api: DeviceGraphApi | Any = FROM_PLATFORM,
        **runner_options: Any,
    ) -> None:
        if context_rows < 1:
            raise ValueError(f"EstimatorGraphs: context_rows must be >= 1, got {context_rows}")
        self.context_rows = context_rows
        self.segments = EstimatorSegments(estimator)
        self.runners: list[DeviceGraphRunner[tuple[torch.Tensor, ...]]] = [
            DeviceGraphRunner(
                fn,
                name=f"flow-estimator.seg{i:02d}",
                device=device,
                clone_outputs=False,
                graph_api=graph_api,
                **runner_options,
            )
            for i, fn in enumerate(self.segments.functions())
        ]
        self.launch_lock = threading.Lock()
        self.eager_launches = 0  # launches `use_for` sent to the eager kernels (unbucketed or too many rows)

    def use_for(self, rows: int, frames: int) -> bool:
        """Whether a launch of `rows` rows and `frames` total frames replays graphs (else it is counted)."""
        if not self.active:
            return False
        if rows <= self.context_rows and frames in buckets.stage_frame_buckets():
            return True
        self.eager_launches += 1
        return False

    @property
    def active(self) -> bool:
        """Whether the runners replay graphs (False: the segments run eagerly through them)."""
        return self.runners[0].graphs_active

    def functions(self) -> Sequence[Segment]:
        return self.runners

    def counters(self) -> list[GraphCounters]:
        return [r.counters() for r in self.runners]

    def clear(self) -> None:
        for runner in self.runners:
            runner.clear()


__all__ = [
    "EstimatorGraphs",
    "EstimatorSegments",
    "Segment",
    "conv_branch",
    "post_attention",
    "pre_attention",
]
