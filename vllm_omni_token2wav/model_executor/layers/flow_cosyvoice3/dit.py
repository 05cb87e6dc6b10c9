# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3's DiT velocity estimator (reference `cosyvoice.flow.DiT.dit.DiT`, F5-TTS style), whole and per chunk.

Stored in `flow.pt` under `decoder.estimator.*` (at full size 331,142,224 parameters + the persistent
`rotary_embed.inv_freq`): `time_embed.time_mlp.{0,2}`, `input_embed.proj`,
`input_embed.conv_pos_embed.conv{1,2}.0`, `transformer_blocks.N.{attn_norm.linear, attn.to_{q,k,v},
attn.to_out.0, ff.ff.0.0, ff.ff.2}` (14 tensors, 14,693,376 parameters per block at dim 1024),
`norm_out.linear`, `proj_out`, `rotary_embed.inv_freq`.

Quirks reproduced exactly (each differs from Step-Audio2's DiT, see docs/design/cosyvoice3.md):
- time embedding of `1000 t`: 256-d `[sin | cos]`, frequencies `exp(-ln(1e4) i / 127)`, i = 0..127;
- input `proj(cat[x, cond, mu, spk repeated])`, then `+ conv_pos(.)` where conv_pos is
  2 x [left-pad 30, Conv1d k31 groups 16, Mish], applied without any mask;
- RoPE (x-transformers: theta 1e4, GPT-J interleaved pairs, `rot_dim = dim_head`) applied to the
  full-width q and k BEFORE the head split, so only the first `dim_head` channels (head 0) rotate;
  positions are absolute frame indices 0..T-1, prompt included;
- block: AdaLN-Zero `(shift, scale, gate)_msa, (shift, scale, gate)_mlp`, LayerNorm eps 1e-6 without
  affine, SDPA scale 1/sqrt(dim_head), attention output zeroed at padded frames, GELU(tanh) MLP;
- final layer modulation chunks in the order (scale, shift), not (shift, scale).

Two ways to run it. `forward`: a whole sequence with full attention or the block-causal streaming mask
(chunks of `static_chunk_size` frames, every earlier chunk visible). `forward_frames`: new frames of
one or several streams laid end to end, where the caller's `attend` callback supplies the keys and
values of each stream's earlier frames and its `pos_embed` runs the conv position embedding with each
stream's last 30 input frames as left context; all other operations are per frame, so a stream's
frames come out as the whole sequence's would (`batched.py` drives it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.config import (
    CONV_POS_GROUPS,
    CONV_POS_KERNEL,
    CosyVoice3FlowConfig,
)

#: attend(q, k, v) -> attention output, all `(B, heads, frames, dim_head)`; q and k already rotated.
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
#: pos_embed(h `(B, frames, dim)`) -> the conv position embedding `(B, frames, dim)` (with the caller's left context).
PosEmbed = Callable[[torch.Tensor], torch.Tensor]

TIME_EMBED_DIM = 256
TIME_SCALE = 1000.0
ROPE_THETA = 10000.0


def sinus_time_embedding(t: torch.Tensor, dim: int = TIME_EMBED_DIM, scale: float = TIME_SCALE) -> torch.Tensor:
    """`[sin | cos]` of `(scale t) * exp(-ln(1e4) i / (dim/2 - 1))`: `(B,) -> (B, dim)`, float32 as the reference."""
    half = dim // 2
    freqs = torch.exp(torch.arange(half, device=t.device, dtype=torch.float32) * -(math.log(10000) / (half - 1)))
    args = scale * t.unsqueeze(1) * freqs.unsqueeze(0)
    return torch.cat([args.sin(), args.cos()], dim=-1)


class TimestepEmbedding(nn.Module):
    def __init__(self, dim: int, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.time_mlp = nn.Sequential(
            nn.Linear(TIME_EMBED_DIM, dim, dtype=dtype), nn.SiLU(), nn.Linear(dim, dim, dtype=dtype)
        )

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.time_mlp(sinus_time_embedding(t).to(t.dtype))


class CausalConvPositionEmbedding(nn.Module):
    """2 x [left context of `kernel - 1` frames, grouped Conv1d, Mish] on `(B, T, D)`; returns the embedding only.

    The left context is zeros at the utterance start, or the caller's `history`: for each conv, its
    input at the `kernel - 1` frames before `x` (`(B, D, kernel - 1)` each).
    """

    def __init__(
        self,
        dim: int,
        kernel_size: int = CONV_POS_KERNEL,
        groups: int = CONV_POS_GROUPS,
        *,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.context = kernel_size - 1
        self.conv1 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups, dtype=dtype), nn.Mish())
        self.conv2 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups, dtype=dtype), nn.Mish())

    def forward(
        self, x: torch.Tensor, history: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x `(B, T, D)` -> (embedding `(B, T, D)`, (conv1 input, conv2 input) incl. history, `(B, D, ctx + T)`)."""
        h = x.transpose(1, 2)
        in1 = F.pad(h, (self.context, 0)) if history is None else torch.cat([history[0], h], dim=2)
        y = self.conv1(in1)
        in2 = F.pad(y, (self.context, 0)) if history is None else torch.cat([history[1], y], dim=2)
        return self.conv2(in2).transpose(1, 2), (in1, in2)


class RotaryEmbedding(nn.Module):
    """x-transformers `RotaryEmbedding(dim_head)`: persistent `inv_freq = theta^(-2i/d)`, interleaved pair angles.

    `inv_freq` is a checkpoint buffer; it stays float32 when the module is cast to a lower precision
    (float16 would put the angle of frame 3000 off by radians).
    """

    inv_freq: torch.Tensor

    def __init__(self, dim: int, theta: float = ROPE_THETA) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (theta ** (torch.arange(0, dim, 2).float() / dim)))

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> RotaryEmbedding:
        exact = self.inv_freq
        super()._apply(fn, recurse)
        if self.inv_freq.dtype != torch.float32:
            self.inv_freq = exact.to(device=self.inv_freq.device, dtype=torch.float32)
        return self

    def angles(self, positions: torch.Tensor) -> torch.Tensor:
        """`(T,)` frame positions -> `(T, dim)` angles `[p f0, p f0, p f1, p f1, ...]` in float32."""
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        return torch.stack((freqs, freqs), dim=-1).flatten(-2)


def apply_rotary(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate the first `angles.size(-1)` channels of `x (B, T, C)` in GPT-J pairs; the rest pass through."""
    rot = angles.size(-1)
    head, tail = x[..., :rot], x[..., rot:]
    pairs = head.unflatten(-1, (-1, 2))
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    out = head * angles.cos() + rotated * angles.sin()  # float32 math, as the reference's autocast-free RoPE
    return torch.cat([out.to(x.dtype), tail], dim=-1)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.heads = heads
        self.dim_head = dim_head
        inner = heads * dim_head
        self.to_q = nn.Linear(dim, inner, dtype=dtype)
        self.to_k = nn.Linear(dim, inner, dtype=dtype)
        self.to_v = nn.Linear(dim, inner, dtype=dtype)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim, dtype=dtype)])

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.heads, self.dim_head)).transpose(1, 2)

    def forward(self, x: torch.Tensor, angles: torch.Tensor, attend: Attend) -> torch.Tensor:
        """x `(B, T, dim)`, angles `(T, dim_head)` -> `(B, T, dim)` (no padding handling: see `DiT.forward`)."""
        q = self._heads(apply_rotary(self.to_q(x), angles))
        k = self._heads(apply_rotary(self.to_k(x), angles))
        out = attend(q, k, self._heads(self.to_v(x)))
        return self.to_out[0](out.transpose(1, 2).flatten(2))


class FeedForward(nn.Module):
    """`ff = [[Linear, GELU(tanh)], Dropout (identity at inference), Linear]` (keys `ff.0.0`, `ff.2`)."""

    def __init__(self, dim: int, inner: int, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.ff = nn.Sequential(
            nn.Sequential(nn.Linear(dim, inner, dtype=dtype), nn.GELU(approximate="tanh")),
            nn.Identity(),
            nn.Linear(inner, dim, dtype=dtype),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x)


class AdaLayerNormZero(nn.Module):
    """`linear(silu(emb))` -> 6 modulations; `norm` is LayerNorm eps 1e-6 without affine."""

    def __init__(self, dim: int, chunks: int = 6, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.silu = nn.SiLU()
        self.linear = nn.Linear(dim, dim * chunks, dtype=dtype)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.chunks = chunks

    def modulations(self, emb: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """emb `(B, dim)` -> `chunks` tensors `(B, 1, dim)`."""
        return tuple(m.unsqueeze(1) for m in self.linear(self.silu(emb)).chunk(self.chunks, dim=1))


class DiTBlock(nn.Module):
    def __init__(
        self, dim: int, heads: int, dim_head: int, ff_inner: int, *, dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        self.attn_norm = AdaLayerNormZero(dim, dtype=dtype)
        self.attn = Attention(dim, heads, dim_head, dtype=dtype)
        self.ff_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ff = FeedForward(dim, ff_inner, dtype=dtype)

    def forward(
        self,
        x: torch.Tensor,
        emb: torch.Tensor,
        angles: torch.Tensor,
        attend: Attend,
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x `(B, T, dim)`, emb `(B, dim)`; `valid (B, T, 1)` bool zeroes the attention output of padded frames."""
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.attn_norm.modulations(emb)
        normed = self.attn_norm.norm(x) * (1 + scale_msa) + shift_msa
        attn = self.attn(normed, angles, attend)
        if valid is not None:
            attn = attn.masked_fill(~valid, 0.0)
        x = x + gate_msa * attn
        normed = self.ff_norm(x) * (1 + scale_mlp) + shift_mlp
        return x + gate_mlp * self.ff(normed)


class FinalLayer(nn.Module):
    """`norm_out`: AdaLN with chunks in the order (scale, shift)."""

    def __init__(self, dim: int, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.silu = nn.SiLU()
        self.linear = nn.Linear(dim, dim * 2, dtype=dtype)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        scale, shift = self.linear(self.silu(emb)).chunk(2, dim=1)
        return self.norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]


class InputEmbedding(nn.Module):
    def __init__(self, mel_dim: int, mu_dim: int, spk_dim: int, dim: int, *, dtype: torch.dtype) -> None:
        super().__init__()
        self.proj = nn.Linear(mel_dim * 2 + mu_dim + spk_dim, dim, dtype=dtype)
        self.conv_pos_embed = CausalConvPositionEmbedding(dim, dtype=dtype)


def block_causal_mask(frames: int, chunk: int, device: torch.device) -> torch.Tensor:
    """`(frames, frames)` bool: frame i sees frame j iff j < (i // chunk + 1) * chunk (all earlier chunks)."""
    pos = torch.arange(frames, device=device)
    return pos[None, :] < ((pos // chunk + 1) * chunk)[:, None]


class DiT(nn.Module):
    """Velocity `v(x, t | mu, spk, cond)`: x, cond, mu `(B, 80, T)`, t `(B,)`, spk `(B, 80)` -> `(B, 80, T)`."""

    def __init__(self, config: CosyVoice3FlowConfig, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        c = config
        self.config = c
        self.time_embed = TimestepEmbedding(c.dim, dtype=dtype)
        self.input_embed = InputEmbedding(c.output_size, c.input_size, c.output_size, c.dim, dtype=dtype)
        self.rotary_embed = RotaryEmbedding(c.dim_head)
        self.transformer_blocks = nn.ModuleList(
            [DiTBlock(c.dim, c.heads, c.dim_head, c.ff_inner, dtype=dtype) for _ in range(c.depth)]
        )
        self.norm_out = FinalLayer(c.dim, dtype=dtype)
        self.proj_out = nn.Linear(c.dim, c.output_size, dtype=dtype)

    @property
    def conv_context(self) -> int:
        """Input frames of history each conv position-embedding layer needs (30)."""
        return self.input_embed.conv_pos_embed.context

    def _run(
        self,
        x: torch.Tensor,
        mu: torch.Tensor,
        t: torch.Tensor,
        spk_frames: torch.Tensor,
        cond: torch.Tensor,
        positions: torch.Tensor,
        pos_embed: PosEmbed,
        attend: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        emb = self.time_embed(t)
        h = self.input_embed.proj(torch.cat([x, cond, mu, spk_frames], dim=1).transpose(1, 2))
        h = pos_embed(h) + h
        angles = self.rotary_embed.angles(positions)
        for index, block in enumerate(self.transformer_blocks):

            def block_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index: int = index) -> torch.Tensor:
                return attend(index, q, k, v)

            h = cast(DiTBlock, block)(h, emb, angles, block_attend, valid)
        return self.proj_out(self.norm_out(h, emb)).transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        mu: torch.Tensor,
        t: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        streaming: bool = False,
    ) -> torch.Tensor:
        """Whole sequence; mask `(B, 1, T)` marks valid frames (None: all); `streaming`: block-causal mask."""
        frames = x.size(2)
        valid = None if mask is None else mask[:, 0].to(torch.bool)
        attn_mask: torch.Tensor | None = None
        if streaming:
            attn_mask = block_causal_mask(frames, self.config.static_chunk_size, x.device)[None, None]
        if valid is not None and not bool(valid.all()):
            keys = valid[:, None, None, :]
            attn_mask = keys if attn_mask is None else attn_mask & keys
        else:
            valid = None

        def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)

        def pos_embed(h: torch.Tensor) -> torch.Tensor:
            return self.input_embed.conv_pos_embed(h)[0]

        positions = torch.arange(frames, device=x.device)
        spk_frames = spks[:, :, None].expand(-1, -1, frames)
        return self._run(
            x, mu, t, spk_frames, cond, positions, pos_embed, attend, None if valid is None else valid[..., None]
        )

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
        attend: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """Frames of one or more streams laid end to end (x, mu, cond, spk_frames `(B, 80, N)`), no padding mask.

        Everything but the conv position embedding and attention is per frame, so the caller decides
        which frames belong together: `positions (N,)` are each frame's absolute RoPE position,
        `pos_embed(h (B, N, dim)) -> (B, N, dim)` runs the causal convs with each stream's own left
        context, and `attend(block, q, k, v)` gets the rotated q / k / v `(B, heads, N, dim_head)` and
        returns the attention output (each frame over its own stream's earlier frames and chunk).
        Returns the velocity `(B, 80, N)`. Streaming (`streaming.py`, `batched.py`) runs through here.
        """
        return self._run(x, mu, t, spk_frames, cond, positions, pos_embed, attend)
