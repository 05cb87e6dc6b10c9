# SPDX-License-Identifier: Apache-2.0
"""One velocity evaluation of CosyVoice3's DiT chunk cut at its attention calls, so the pieces can be captured.

A flow launch (`batched.run_rows`) evaluates the DiT `n_timesteps` times on the launch's frames laid
end to end (`[2 CFG, N, dim]`). Per block it does modulation, LayerNorm, q / k / v with RoPE, then
attention of every row against its own growing K/V arena (the arena's writes and per-row,
per-50-frame-piece reads: history lengths differ per row and grow every chunk), then the output
projection, residual and MLP. Before the blocks, the conv position embedding runs per row in
fixed-shape pieces with each row's own left context (`batched._piecewise_conv`). Everything else is
per frame on launch-shaped tensors, so cutting at the position embedding and at every attention
call leaves `depth + 2` segments whose tensor shapes depend on N alone:

| segment          | computes                                                          | returns                   |
|------------------|-------------------------------------------------------------------|---------------------------|
| `input`          | time embedding of t, `proj(cat[x, cond, mu, spk])`                | emb, h                    |
| (eager)          | conv position embedding per row (`pos_embed`)                     | p                         |
| `seg00`          | h = p + h, RoPE angles of the positions, pre(0)                   | h, angles, m_0, q, k, v   |
| `segNN` (1..d-1) | post(NN - 1), pre(NN)                                             | h, m_NN, q, k, v          |
| `seg{d}`         | post(d - 1), final layer, `proj_out`                              | velocity                  |
| (eager)          | between segments: `attend(block, q, k, v)` (arena write + reads)  | o                         |

pre(i) = block i's modulations `m` (all six in one tensor), `norm(h) * (1 + scale) + shift`, and the
rotated, head-split q / k / v; post(i) = `h + gate * to_out(o)`, then `+ gate * ff(norm(h) * (1 +
scale) + shift)`: exactly the ops of `DiTBlock.forward` in the same order, so a segment replay gives
the eager launch's values bit for bit (tested against `DiT.forward_frames`).

Why the segment cut and not the K/V arena as static buffers: attention over a padded history bucket
needs a mask, and a masked softmax over padded keys is not bit-identical to the eager kernel over
the exact keys (its reduction splits with the key length); the arena also grows per row. With the
cut, attention stays the eager kernel on the same arena views (exact), and the keys are one per
launch size N (a `stage_frame_buckets()` size): rows, chunk lengths and history lengths do not enter
them, so a few graphs serve every mix of requests (the Step-Audio2 estimator does the same,
`layers/flow/estimator_segments.py`).

`DiTSegments` are the eager functions; `FlowGraphs` wraps each in a `DeviceGraphRunner`
(`cosyvoice3-flow.input`, `cosyvoice3-flow.seg00` ...) and offers `forward_frames` with the
signature of `DiT.forward_frames`, which `batched.run_rows(..., forward=)` calls. Outputs are the
runners' static tensors (`clone_outputs=False`): each is consumed (copied into the next segment's
inputs, or written into the arena / read by attention) before the same segment replays again at the
next Euler step. Launches run one at a time (the stage's step executor), which this relies on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

from vllm_omni_token2wav.model_executor import buckets
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.dit import DiT, DiTBlock, PosEmbed, apply_rotary
from vllm_omni_token2wav.platforms.device import DeviceSpec
from vllm_omni_token2wav.platforms.device_graphs import FROM_PLATFORM, DeviceGraphRunner, GraphCounters
from vllm_omni_token2wav.platforms.graph_api import DeviceGraphApi

Segment = Callable[..., Any]
#: attend(block, q, k, v) -> o, as `DiT.forward_frames` takes it.
BlockAttend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

#: Runner name prefix (`cosyvoice3-flow.input`, `cosyvoice3-flow.seg00`, ...).
RUNNER_PREFIX = "cosyvoice3-flow"


def pre_attention(
    block: DiTBlock, h: torch.Tensor, emb: torch.Tensor, angles: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(m, q, k, v) of one block: its six modulations `(B, 6 dim)` and the rotated, head-split q / k / v."""
    norm = block.attn_norm
    m = norm.linear(norm.silu(emb))
    shift_msa, scale_msa = (c.unsqueeze(1) for c in m.chunk(norm.chunks, dim=1)[:2])
    normed = norm.norm(h) * (1 + scale_msa) + shift_msa
    attn = block.attn
    q = attn._heads(apply_rotary(attn.to_q(normed), angles))
    k = attn._heads(apply_rotary(attn.to_k(normed), angles))
    v = attn._heads(attn.to_v(normed))
    return m, q, k, v


def post_attention(block: DiTBlock, h: torch.Tensor, m: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """h after one block, given its modulations `m` and attention output `o` `(B, heads, N, dim_head)`."""
    _, _, gate_msa, shift_mlp, scale_mlp, gate_mlp = (c.unsqueeze(1) for c in m.chunk(block.attn_norm.chunks, dim=1))
    attn = block.attn.to_out[0](o.transpose(1, 2).flatten(2))
    h = h + gate_msa * attn
    normed = block.ff_norm(h) * (1 + scale_mlp) + shift_mlp
    return h + gate_mlp * block.ff(normed)


class DiTSegments:
    """The `depth + 2` eager segment functions of one CosyVoice3 DiT (see the module table)."""

    def __init__(self, estimator: DiT) -> None:
        self.estimator = estimator
        self.blocks = [cast(DiTBlock, b) for b in estimator.transformer_blocks]

    @property
    def count(self) -> int:
        return len(self.blocks) + 2

    def input(
        self, x: torch.Tensor, mu: torch.Tensor, t: torch.Tensor, spk_frames: torch.Tensor, cond: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(emb `(B, dim)`, h `(B, N, dim)`): the time embedding and the input projection."""
        est = self.estimator
        emb = est.time_embed(t)
        h = est.input_embed.proj(torch.cat([x, cond, mu, spk_frames], dim=1).transpose(1, 2))
        return emb, h

    def first(
        self, p: torch.Tensor, h: torch.Tensor, emb: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """h + its position embedding `p`, the RoPE angles of `positions`, then block 0's pre-attention part."""
        h = p + h
        angles = self.estimator.rotary_embed.angles(positions)
        return (h, angles, *pre_attention(self.blocks[0], h, emb, angles))

    def middle(self, index: int) -> Segment:
        """Segment `index` (1..depth-1): post(index - 1) then pre(index)."""
        done, following = self.blocks[index - 1], self.blocks[index]

        def segment(
            h: torch.Tensor, emb: torch.Tensor, angles: torch.Tensor, m: torch.Tensor, o: torch.Tensor
        ) -> tuple[torch.Tensor, ...]:
            h = post_attention(done, h, m, o)
            return (h, *pre_attention(following, h, emb, angles))

        return segment

    def last(self, h: torch.Tensor, emb: torch.Tensor, m: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """post(depth - 1), the final layer and `proj_out`: the velocity `(B, 80, N)`."""
        est = self.estimator
        h = post_attention(self.blocks[-1], h, m, o)
        return est.proj_out(est.norm_out(h, emb)).transpose(1, 2)

    def functions(self) -> list[Segment]:
        return [self.input, self.first, *(self.middle(i) for i in range(1, len(self.blocks))), self.last]

    def names(self) -> list[str]:
        return ["input", *(f"seg{i:02d}" for i in range(len(self.blocks) + 1))]


def run_segments(
    functions: Sequence[Segment],
    x: torch.Tensor,
    mu: torch.Tensor,
    t: torch.Tensor,
    spk_frames: torch.Tensor,
    cond: torch.Tensor,
    *,
    positions: torch.Tensor,
    pos_embed: PosEmbed,
    attend: BlockAttend,
) -> torch.Tensor:
    """`DiT.forward_frames` through the segment functions (eager ones, or runners replaying them)."""
    first, *middle, last = functions[1:]
    emb, h = functions[0](x, mu, t, spk_frames, cond)
    p = pos_embed(h)
    h, angles, m, q, k, v = first(p, h, emb, positions)
    for block, segment in enumerate(middle):
        o = attend(block, q, k, v)
        h, m, q, k, v = segment(h, emb, angles, m, o)
    o = attend(len(middle), q, k, v)
    return cast(torch.Tensor, last(h, emb, m, o))


class FlowGraphs:
    """The segments of one CosyVoice3 DiT, each replayed from device graphs keyed by the launch's frames N.

    The caller asks `use_for(frames)` once per launch: only launches whose N (frames + padding) is a
    stage bucket (`buckets.stage_frame_buckets()`) replay graphs; others (a one-off shape) run the plain
    eager kernel (`forward=None`) and are counted in `eager_launches`, so no one-off shape costs a
    capture. Runner options (`enabled`, `max_graphs`, ...) apply to every segment; `graph_api` defaults
    to the serving platform's (tests pass a fake).
    """

    def __init__(
        self,
        estimator: DiT,
        *,
        device: DeviceSpec = None,
        graph_api: DeviceGraphApi | Any = FROM_PLATFORM,
        **runner_options: Any,
    ) -> None:
        self.segments = DiTSegments(estimator)
        self.runners: list[DeviceGraphRunner[Any]] = [
            DeviceGraphRunner(
                fn,
                name=f"{RUNNER_PREFIX}.{name}",
                device=device,
                clone_outputs=False,
                graph_api=graph_api,
                **runner_options,
            )
            for fn, name in zip(self.segments.functions(), self.segments.names(), strict=True)
        ]
        self.eager_launches = 0  # launches `use_for` sent to the eager kernel (frames not a stage bucket)
        self.graph_launches = 0  # launches `use_for` accepted (each replays every segment once per Euler step)

    @property
    def active(self) -> bool:
        """Whether the runners replay graphs (False: nothing is captured; the stage runs the plain kernel)."""
        return self.runners[0].graphs_active

    def use_for(self, frames: int) -> bool:
        """Whether a launch of `frames` total frames (padding included) replays graphs (else it is counted)."""
        if not self.active:
            return False
        if frames in buckets.stage_frame_buckets():
            self.graph_launches += 1
            return True
        self.eager_launches += 1
        return False

    def forward_frames(
        self,
        x: torch.Tensor,
        mu: torch.Tensor,
        t: torch.Tensor,
        spk_frames: torch.Tensor,
        cond: torch.Tensor,
        *,
        positions: torch.Tensor,
        pos_embed: PosEmbed,
        attend: BlockAttend,
    ) -> torch.Tensor:
        """`DiT.forward_frames` with the segments replayed (same arguments, same values); ask `use_for` first."""
        return run_segments(
            self.runners, x, mu, t, spk_frames, cond, positions=positions, pos_embed=pos_embed, attend=attend
        )

    def counters(self) -> list[GraphCounters]:
        return [r.counters() for r in self.runners]

    def clear(self) -> None:
        for runner in self.runners:
            runner.clear()


__all__ = [
    "RUNNER_PREFIX",
    "DiTSegments",
    "FlowGraphs",
    "post_attention",
    "pre_attention",
    "run_segments",
]
