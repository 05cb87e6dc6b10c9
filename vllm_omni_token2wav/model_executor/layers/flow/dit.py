# SPDX-License-Identifier: Apache-2.0
"""DiT velocity estimator of the flow model (reference `cosyvoice2.flow.decoder_dit.DiT`).

Stored in `flow.pt` under `decoder.estimator.*`: `t_embedder.mlp.{0,2}`, `in_proj`, `blocks.N.{attn,mlp,conv,
adaLN_modulation}`, `final_layer.{adaLN_modulation.1,linear}`. Each block holds 24 tensors (7,089,408
parameters at hidden 512, 8 heads x 64, mlp_ratio 4).

Block (adaLN-Zero with an extra causal conv branch), `c` = timestep embedding:
    shift/scale/gate x {msa, mlp, conv} = Linear(SiLU(c)).chunk(9)
    x += g_msa  * Attn(modulate(norm1(x)))
    x += g_conv * ConvBlock(modulate(norm3(x)))
    x += g_mlp  * MLP(modulate(norm2(x)))          modulate(x) = x * (1 + scale) + shift

Streaming (`forward_chunk`): attention keys/values are the chunk's own followed by the cached ones
("newest first", the reference order; attention has no positions so only trimming sees the order);
the conv branch keeps the last 2 input frames of each of its two causal convs. Cache layouts:
cnn `(depth, B, 2 * hidden, 2)`, att `(depth, B, heads, t, 2 * head_dim)` (keys | values).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embedding `(N, dim)` of (fractional) timesteps `t (N,)`, order `[cos, sin]`.

    `freqs_i = exp(-ln(max_period) * i / (dim // 2))`, computed in float32 and cast to t's dtype
    (GLIDE convention, as the reference). Odd `dim` gets a zero column.
    """
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None] * freqs.to(t.dtype)[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


class TimestepEmbedder(nn.Module):
    """`mlp(timestep_embedding(1000 * t, 256))` with mlp = Linear -> SiLU -> Linear."""

    def __init__(
        self, hidden_size: int, frequency_embedding_size: int = 256, *, dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(frequency_embedding_size, hidden_size, dtype=dtype),
            nn.SiLU(),
            nn.Linear(hidden_size, hidden_size, dtype=dtype),
        )
        self.frequency_embedding_size = frequency_embedding_size
        self.scale = 1000

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(timestep_embedding(t * self.scale, self.frequency_embedding_size))


class Mlp(nn.Module):
    """fc1 -> GELU(tanh) -> fc2."""

    def __init__(self, in_features: int, hidden_features: int, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features, dtype=dtype)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden_features, in_features, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class DiTAttention(nn.Module):
    """Multi-head attention with per-head LayerNorm on q and k (eps 1e-5, affine), SDPA default scale."""

    def __init__(self, dim: int, num_heads: int = 8, head_dim: int = 64, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        inner = num_heads * head_dim
        self.to_q = nn.Linear(dim, inner, dtype=dtype)
        self.to_k = nn.Linear(dim, inner, dtype=dtype)
        self.to_v = nn.Linear(dim, inner, dtype=dtype)
        self.q_norm = nn.LayerNorm(head_dim, dtype=dtype)
        self.k_norm = nn.LayerNorm(head_dim, dtype=dtype)
        self.proj = nn.Linear(inner, dim, dtype=dtype)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.reshape(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`(B, T, C)` -> per-head q, k (normed) and v `(B, H, T, head_dim)`: the attention's input half."""
        q = self.q_norm(self._heads(self.to_q(x)))
        k = self.k_norm(self._heads(self.to_k(x)))
        return q, k, self._heads(self.to_v(x))

    def project_out(self, x: torch.Tensor) -> torch.Tensor:
        """Per-head attention output `(B, H, T, head_dim)` -> `(B, T, C)`: heads merged and projected."""
        b, _, t, _ = x.shape
        return self.proj(x.transpose(1, 2).reshape(b, t, -1))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x `(B, T, C)`, attn_mask `(B, 1, T)` bool (True = attend) or None."""
        q, k, v = self.project_qkv(x)
        mask = None if attn_mask is None else attn_mask.to(torch.bool).unsqueeze(1)
        return self.project_out(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))

    def forward_chunk(
        self, x: torch.Tensor, att_cache: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x `(B, t, C)`, att_cache `(B, H, tc, 2 * head_dim)` -> (out, new cache `(B, H, t + tc, 2 * head_dim)`)."""
        q, k, v = self.project_qkv(x)
        if att_cache is not None:
            k_cache, v_cache = att_cache.chunk(2, dim=3)
            k = torch.cat([k, k_cache], dim=2)
            v = torch.cat([v, v_cache], dim=2)
        new_cache = torch.cat([k, v], dim=3)
        return self.project_out(F.scaled_dot_product_attention(q, k, v)), new_cache


class Transpose(nn.Module):
    def __init__(self, dim0: int, dim1: int) -> None:
        super().__init__()
        self.dim0 = dim0
        self.dim1 = dim1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(self.dim0, self.dim1)


class CausalConv1d(nn.Conv1d):
    """Conv1d with `kernel_size - 1` zeros on the left (whole utterance) or the cached last frames (chunk)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, *, dtype: torch.dtype) -> None:
        super().__init__(in_channels, out_channels, kernel_size, dtype=dtype)
        self.context = kernel_size - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.context, 0)))

    def forward_chunk(
        self, x: torch.Tensor, cnn_cache: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if cnn_cache is None:
            cnn_cache = x.new_zeros(x.size(0), self.in_channels, self.context)
        x = torch.cat([cnn_cache, x], dim=2)
        return super().forward(x), x[..., -self.context :]


class CausalConvBlock(nn.Module):
    """`block` = [T, CausalConv1d, T, LayerNorm, Mish, T, CausalConv1d, T] on `(B, T, C)` input."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int = 3, *, dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.block = nn.Sequential(
            Transpose(1, 2),
            CausalConv1d(in_channels, out_channels, kernel_size, dtype=dtype),
            Transpose(1, 2),
            nn.LayerNorm(out_channels, dtype=dtype),
            nn.Mish(),
            Transpose(1, 2),
            CausalConv1d(out_channels, out_channels, kernel_size, dtype=dtype),
            Transpose(1, 2),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)

    def forward_chunk(
        self, x: torch.Tensor, cnn_cache: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cnn_cache `(B, in + out, k - 1)`: conv1's input context then conv2's."""
        c1, c2 = (None, None) if cnn_cache is None else cnn_cache.split((self.in_channels, self.out_channels), 1)
        conv1, conv2 = cast(CausalConv1d, self.block[1]), cast(CausalConv1d, self.block[6])
        x, n1 = conv1.forward_chunk(self.block[0](x), c1)
        x = self.block[2:6](x)
        x, n2 = conv2.forward_chunk(x, c2)
        return self.block[7](x), torch.cat([n1, n2], dim=1)


class DiTBlock(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        mlp_ratio: float = 4.0,
        *,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = DiTAttention(hidden_size, num_heads, head_dim, dtype=dtype)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden_size, int(hidden_size * mlp_ratio), dtype=dtype)
        self.norm3 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.conv = CausalConvBlock(hidden_size, hidden_size, 3, dtype=dtype)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 9 * hidden_size, dtype=dtype))  # noqa: N815

    def forward(
        self,
        x: torch.Tensor,
        c: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        *,
        attention: Callable[[torch.Tensor], torch.Tensor] | None = None,
        conv: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """`attention` / `conv` replace `self.attn(., attn_mask)` / `self.conv` (several utterances laid end to
        end on the time axis, `whole_rows.py`: each row attends and convolves over its own frames only)."""
        s_msa, sc_msa, g_msa, s_mlp, sc_mlp, g_mlp, s_conv, sc_conv, g_conv = self.adaLN_modulation(c).chunk(9, -1)
        h = modulate(self.norm1(x), s_msa, sc_msa)
        x = x + g_msa * (self.attn(h, attn_mask) if attention is None else attention(h))
        h = modulate(self.norm3(x), s_conv, sc_conv)
        x = x + g_conv * (self.conv(h) if conv is None else conv(h))
        return x + g_mlp * self.mlp(modulate(self.norm2(x), s_mlp, sc_mlp))

    def forward_chunk(
        self,
        x: torch.Tensor,
        c: torch.Tensor,
        cnn_cache: torch.Tensor | None = None,
        att_cache: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s_msa, sc_msa, g_msa, s_mlp, sc_mlp, g_mlp, s_conv, sc_conv, g_conv = self.adaLN_modulation(c).chunk(9, -1)
        x_att, new_att = self.attn.forward_chunk(modulate(self.norm1(x), s_msa, sc_msa), att_cache)
        x = x + g_msa * x_att
        x_conv, new_cnn = self.conv.forward_chunk(modulate(self.norm3(x), s_conv, sc_conv), cnn_cache)
        x = x + g_conv * x_conv
        x = x + g_mlp * self.mlp(modulate(self.norm2(x), s_mlp, sc_mlp))
        return x, new_cnn, new_att


class FinalLayer(nn.Module):
    def __init__(self, hidden_size: int, out_channels: int, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size, dtype=dtype))  # noqa: N815
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, out_channels, dtype=dtype)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class DiT(nn.Module):
    """Velocity `v(x, t | mu, spk, cond)`; input channels = [x | mu | spk repeated over time | cond]."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        mlp_ratio: float = 4.0,
        depth: int = 28,
        num_heads: int = 8,
        head_dim: int = 64,
        hidden_size: int = 256,
        *,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.t_embedder = TimestepEmbedder(hidden_size, dtype=dtype)
        self.in_proj = nn.Linear(in_channels, hidden_size, dtype=dtype)
        self.blocks = nn.ModuleList(
            [DiTBlock(hidden_size, num_heads, head_dim, mlp_ratio, dtype=dtype) for _ in range(depth)]
        )
        self.final_layer = FinalLayer(hidden_size, out_channels, dtype=dtype)

    def _inputs(
        self, x: torch.Tensor, mu: torch.Tensor, t: torch.Tensor, spks: torch.Tensor | None, cond: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [x, mu]
        if spks is not None:  # (B, C), or already per frame (B, C, T)
            parts.append(spks if spks.dim() == 3 else spks[:, :, None].expand(-1, -1, x.size(-1)))
        if cond is not None:
            parts.append(cond)
        h = torch.cat(parts, dim=1)
        if h.size(1) != self.in_channels:
            raise ValueError(
                f"DiT: concatenated input has {h.size(1)} channels, expected in_channels={self.in_channels}"
            )
        return self.in_proj(h.transpose(1, 2)), self.t_embedder(t).unsqueeze(1)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        mu: torch.Tensor,
        t: torch.Tensor,
        spks: torch.Tensor | None = None,
        cond: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x, mu, cond `(B, C, T)`; mask `(B, 1, T)`; t `(B,)`; spks `(B, C)` -> velocity `(B, out, T)`."""
        h, c = self._inputs(x, mu, t, spks, cond)
        for block in self.blocks:
            h = block(h, c, mask)
        return self.final_layer(h, c).transpose(1, 2)

    def forward_rows(
        self,
        x: torch.Tensor,
        mu: torch.Tensor,
        t: torch.Tensor,
        spk_frames: torch.Tensor,
        cond: torch.Tensor,
        spans: Sequence[tuple[int, int]],
    ) -> torch.Tensor:
        """Several whole utterances laid end to end on the time axis (x, mu, spk_frames, cond `(B, C, N)`, row i
        on frames `spans[i]`): every per-frame op once over all frames, attention and the causal conv branch per
        row over its own frames, each the call `forward` makes for the row alone (an all-ones mask). Returns the
        velocity `(B, out, N)`; each row's frames are what `forward` gives that row alone (`whole_rows.py`)."""
        h, c = self._inputs(x, mu, t, spk_frames, cond)
        for block in self.blocks:
            block = cast(DiTBlock, block)

            def attention(h_in: torch.Tensor, attn: DiTAttention = block.attn) -> torch.Tensor:
                q, k, v = attn.project_qkv(h_in)
                out = torch.zeros_like(q)
                for s, e in spans:
                    mask = torch.ones(q.size(0), 1, 1, e - s, dtype=torch.bool, device=q.device)
                    out[:, :, s:e] = F.scaled_dot_product_attention(
                        q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], attn_mask=mask
                    )
                return attn.project_out(out)

            def conv(h_in: torch.Tensor, branch: CausalConvBlock = block.conv) -> torch.Tensor:
                out = torch.zeros_like(h_in)
                for s, e in spans:  # zeros before each row's first frame, as alone
                    out[:, s:e] = branch(h_in[:, s:e])
                return out

            h = block(h, c, attention=attention, conv=conv)
        return self.final_layer(h, c).transpose(1, 2)

    def forward_chunk(
        self,
        x: torch.Tensor,
        mu: torch.Tensor,
        t: torch.Tensor,
        spks: torch.Tensor | None,
        cond: torch.Tensor | None,
        cnn_cache: torch.Tensor | None = None,
        att_cache: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Like `forward` for one chunk, no mask; returns (velocity, new cnn cache, new att cache)."""
        h, c = self._inputs(x, mu, t, spks, cond)
        new_cnn, new_att = [], []
        for idx, block in enumerate(self.blocks):
            h, cnn, att = cast(DiTBlock, block).forward_chunk(
                h, c, None if cnn_cache is None else cnn_cache[idx], None if att_cache is None else att_cache[idx]
            )
            new_cnn.append(cnn)
            new_att.append(att)
        return self.final_layer(h, c).transpose(1, 2), torch.stack(new_cnn, 0), torch.stack(new_att, 0)
