# SPDX-License-Identifier: Apache-2.0
"""Token encoder of the flow model: relative-position conformer, pre-lookahead layer, x2 upsampling.

`flow.pt` stores this encoder under `encoder.*` with the module tree of the reference
`UpsampleConformerEncoderV2` (Step-Audio2 / MiniCPM-o `cosyvoice2` package), so the class and
attribute names below are part of the checkpoint format: `embed.out.{0,1}`, `pre_lookahead_layer.conv{1,2}`,
`encoders.N.{self_attn,feed_forward,norm_mha,norm_ff}`, `up_layer.conv`, `up_embed`, `up_encoders.N`,
`after_norm`. Each conformer layer holds 19 tensors (3,415,552 parameters at d=512, 2048 FFN units).

Two entry points share the weights:
- `forward(xs, xs_lens)`: whole utterance, bidirectional attention, zero padding at the edges.
- `forward_chunk(xs, last_chunk, cnn_cache, att_cache)`: one streaming chunk of tokens that ends with
  `pre_lookahead_len` lookahead tokens (or is the last chunk, padded with zeros instead). The chunk
  attends to the cached keys/values of everything before it.

Streaming cache layouts (the reference's, kept so caches stay interchangeable):
- cnn cache `(B, C, 2 + 2 * up_stride)`: the last 2 pre-lookahead conv1 outputs, then the last
  `2 * up_stride` upsampled frames that feed `up_layer.conv`.
- att cache `(num_blocks + num_up_blocks, B, heads, 2 * t, 2 * d_k)`, keys | values on the last dim, oldest
  first. The token-rate layers (first `num_blocks`) have only `t` entries; they are stored tiled twice
  (`[c, c]`) so one tensor holds both rates, and the first half is read back.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.layers.flow.pre_lookahead import PreLookaheadLayer

logger = init_logger(__name__)

#: Length of the ESPnet relative positional table (positions -(L-1) .. L-1); the reference never extends it.
REL_POS_MAX_LEN = 5000


def relative_position_table(max_len: int, d_model: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """ESPnet relative positional table `(1, 2 * max_len - 1, d_model)`.

    Row m holds relative position `max_len - 1 - m` (so positive positions first, descending):
    `pe[m, 2i] = sin(r * w_i)`, `pe[m, 2i + 1] = cos(r * w_i)`, `w_i = exp(-2i * ln(10000) / d_model)`,
    computed in float32 like the reference and cast once.
    """
    rel = torch.arange(max_len - 1, -max_len, -1, dtype=torch.float32).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * -(math.log(10000.0) / d_model))
    pe = torch.zeros(2 * max_len - 1, d_model, dtype=torch.float32)
    pe[:, 0::2] = torch.sin(rel * div_term)
    pe[:, 1::2] = torch.cos(rel * div_term)
    return pe.unsqueeze(0).to(dtype)


def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """Transformer-XL relative shift `(B, H, T1, 2 * T2 - 1) -> (B, H, T1, T2)` by the pad/reshape trick.

    For T1 == T2 == T this is `out[i, j] = x[i, T - 1 - i + j]` (score of key j for query i at relative
    position i - j). For a streaming chunk (T1 < T2) the reference applies the same trick unchanged; the
    result is the gather `out[i, j] = F[T1 + i * W + j]` over the zero-left-padded rows flattened
    (`W = 2 * T2 - 1`, F of row length W + 1). The trained weights saw exactly this, so it is kept.
    """
    b, h, t1, width = x.shape
    padded = torch.cat([x.new_zeros(b, h, t1, 1), x], dim=-1)
    padded = padded.view(b, h, width + 1, t1)
    return padded[:, :, 1:].reshape(b, h, t1, width)[..., : width // 2 + 1]


class EspnetRelPositionalEncoding(nn.Module):
    """Scale by sqrt(d_model) and hand out the centred slice of the relative table.

    The table is a non-persistent buffer (never in `flow.pt`); it follows `.to()` / `.half()` like
    the reference's cast-on-use attribute.
    """

    pe: torch.Tensor

    def __init__(
        self,
        d_model: int,
        dropout_rate: float = 0.0,
        max_len: int = REL_POS_MAX_LEN,
        *,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.xscale = math.sqrt(d_model)
        self.max_len = max_len
        self.dropout = nn.Dropout(p=dropout_rate)
        self.register_buffer("pe", relative_position_table(max_len, d_model, dtype), persistent=False)

    def position_encoding(self, size: int) -> torch.Tensor:
        """Relative encodings for `size` keys: `(1, 2 * size - 1, d_model)`, positions size-1 .. -(size-1)."""
        if size > self.max_len:
            raise ValueError(
                f"flow encoder: {size} positions requested but the relative positional table holds "
                f"{self.max_len} (the reference never extends it); the prompt plus the streamed/whole "
                "utterance is too long (about 100 s of mel at 50 Hz), or the conformer cache is not trimmed"
            )
        center = self.pe.size(1) // 2
        return self.pe[:, center - size + 1 : center + size]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos_emb = self.position_encoding(x.size(1))
        return self.dropout(x * self.xscale), self.dropout(pos_emb)


class LinearEmbed(nn.Module):
    """Linear -> LayerNorm(eps 1e-5) -> dropout, then the positional scaling (reference `LinearNoSubsampling`)."""

    def __init__(
        self,
        idim: int,
        odim: int,
        dropout_rate: float,
        pos_enc: EspnetRelPositionalEncoding,
        *,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.out = nn.Sequential(
            nn.Linear(idim, odim, dtype=dtype),
            nn.LayerNorm(odim, eps=1e-5, dtype=dtype),
            nn.Dropout(dropout_rate),
        )
        self.pos_enc = pos_enc

    def position_encoding(self, size: int) -> torch.Tensor:
        return self.pos_enc.position_encoding(size)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pos_enc(self.out(x))


class RelPositionMultiHeadedAttention(nn.Module):
    """Self-attention with Transformer-XL relative positions (ESPnet "rel_selfattn").

    `scores = ((q + u) k^T + rel_shift((q + v) p^T)) / sqrt(d_k)`; the positional term goes into SDPA
    as an additive bias, which is the same softmax as the reference's explicit matmuls.
    """

    def __init__(
        self,
        n_head: int,
        n_feat: int,
        dropout_rate: float = 0.0,
        key_bias: bool = True,
        *,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if n_feat % n_head:
            raise ValueError(f"flow encoder: attention size {n_feat} is not divisible by {n_head} heads")
        self.d_k = n_feat // n_head
        self.h = n_head
        self.linear_q = nn.Linear(n_feat, n_feat, dtype=dtype)
        self.linear_k = nn.Linear(n_feat, n_feat, bias=key_bias, dtype=dtype)
        self.linear_v = nn.Linear(n_feat, n_feat, dtype=dtype)
        self.linear_out = nn.Linear(n_feat, n_feat, dtype=dtype)
        self.linear_pos = nn.Linear(n_feat, n_feat, bias=False, dtype=dtype)
        self.pos_bias_u = nn.Parameter(torch.empty(n_head, self.d_k, dtype=dtype))
        self.pos_bias_v = nn.Parameter(torch.empty(n_head, self.d_k, dtype=dtype))
        nn.init.xavier_uniform_(self.pos_bias_u)
        nn.init.xavier_uniform_(self.pos_bias_v)
        self.dropout_rate = dropout_rate

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        pos_emb: torch.Tensor,
        cache: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x `(B, T1, C)`, mask `(B, 1, T2)` bool (True = valid key) or None, pos_emb `(1, 2*T2-1, C)`,
        cache `(B, H, Tc, 2*d_k)` or None. Returns the output and the new cache `(B, H, Tc + T1, 2*d_k)`."""
        b, t1, _ = x.shape
        q = self.linear_q(x).view(b, t1, self.h, self.d_k)
        k = self.linear_k(x).view(b, t1, self.h, self.d_k).transpose(1, 2)
        v = self.linear_v(x).view(b, t1, self.h, self.d_k).transpose(1, 2)
        if cache is not None and cache.size(2) > 0:
            k_cache, v_cache = cache.split(self.d_k, dim=-1)
            k = torch.cat([k_cache, k], dim=2)
            v = torch.cat([v_cache, v], dim=2)
        new_cache = torch.cat([k, v], dim=-1)

        p = self.linear_pos(pos_emb).view(pos_emb.size(0), -1, self.h, self.d_k).transpose(1, 2)
        q_u = (q + self.pos_bias_u).transpose(1, 2)
        q_v = (q + self.pos_bias_v).transpose(1, 2)
        bias = rel_shift(torch.matmul(q_v, p.transpose(-2, -1))) / math.sqrt(self.d_k)
        if mask is not None:
            keep = mask[:, None, :, : k.size(2)].to(torch.bool)
            bias = bias.masked_fill(~keep, float("-inf"))
        dropout_p = self.dropout_rate if self.training else 0.0
        out = F.scaled_dot_product_attention(q_u, k, v, attn_mask=bias, dropout_p=dropout_p)
        out = out.transpose(1, 2).reshape(b, t1, self.h * self.d_k)
        return self.linear_out(out), new_cache


class PositionwiseFeedForward(nn.Module):
    """`w_2(SiLU(w_1(x)))` (ESPnet key names)."""

    def __init__(
        self, idim: int, hidden_units: int, dropout_rate: float = 0.0, *, dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        self.w_1 = nn.Linear(idim, hidden_units, dtype=dtype)
        self.activation = nn.SiLU()
        self.dropout = nn.Dropout(dropout_rate)
        self.w_2 = nn.Linear(hidden_units, idim, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.dropout(self.activation(self.w_1(x))))


class ConformerEncoderLayer(nn.Module):
    """Pre-norm layer: `x + MHA(norm_mha(x))`, then `x + FFN(norm_ff(x))` (LayerNorm eps 1e-12).

    The reference class also supports macaron FFN and a convolution module; this checkpoint has
    neither, so they are not built (no keys for them exist in `flow.pt`).
    """

    def __init__(
        self,
        size: int,
        self_attn: RelPositionMultiHeadedAttention,
        feed_forward: PositionwiseFeedForward,
        dropout_rate: float = 0.0,
        *,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.norm_ff = nn.LayerNorm(size, eps=1e-12, dtype=dtype)
        self.norm_mha = nn.LayerNorm(size, eps=1e-12, dtype=dtype)
        self.dropout = nn.Dropout(dropout_rate)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        pos_emb: torch.Tensor,
        att_cache: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x_att, new_cache = self.self_attn(self.norm_mha(x), mask, pos_emb, att_cache)
        x = x + self.dropout(x_att)
        x = x + self.dropout(self.feed_forward(self.norm_ff(x)))
        return x, new_cache


class Upsample1D(nn.Module):
    """Nearest x`stride` upsampling, left-pad `2 * stride`, Conv1d kernel `2 * stride + 1` (causal)."""

    def __init__(
        self,
        channels: int,
        out_channels: int,
        stride: int = 2,
        scale_factor: float | None = None,
        *,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.channels = channels
        self.out_channels = out_channels
        self.stride = stride
        self.scale_factor = float(stride) if scale_factor is None else float(scale_factor)
        self.conv = nn.Conv1d(channels, out_channels, stride * 2 + 1, dtype=dtype)

    def forward(self, inputs: torch.Tensor, input_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.interpolate(inputs, scale_factor=self.scale_factor, mode="nearest")
        return self.conv(F.pad(x, (self.stride * 2, 0))), input_lengths * self.stride

    def forward_chunk(
        self, inputs: torch.Tensor, cache: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """inputs `(B, C, T)`, cache `(B, C, 2 * stride)` of upsampled frames -> (`(B, C', stride * T)`, new cache)."""
        x = F.interpolate(inputs, scale_factor=self.scale_factor, mode="nearest")
        if cache is None:
            cache = x.new_zeros(x.size(0), x.size(1), self.stride * 2)
        x = torch.cat([cache, x], dim=2)
        new_cache = x[..., -self.stride * 2 :]
        return self.conv(x), new_cache


def _pad_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """`(B, 1, max_len)` bool, True on valid frames."""
    return (torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]).unsqueeze(1)


_SUPPORTED_OPTIONS = {
    "input_layer": "linear",
    "pos_enc_layer_type": "rel_pos_espnet",
    "selfattention_layer_type": "rel_selfattn",
    "activation_type": "swish",
    "normalize_before": True,
}


class UpsampleConformerEncoderV2(nn.Module):
    """Embed -> pre-lookahead -> `num_blocks` conformer layers -> x2 upsample -> re-embed ->
    `num_up_blocks` layers -> after_norm. Token rate in, mel rate (x `up_stride`) out."""

    def __init__(
        self,
        input_size: int,
        output_size: int = 256,
        input_layer: str = "linear",
        pre_lookahead_len: int = 3,
        num_blocks: int = 6,
        num_up_blocks: int = 4,
        up_stride: int = 2,
        up_scale_factor: float = 2,
        attention_heads: int = 4,
        pos_enc_layer_type: str = "rel_pos_espnet",
        selfattention_layer_type: str = "rel_selfattn",
        key_bias: bool = True,
        linear_units: int = 2048,
        dropout_rate: float = 0.1,
        positional_dropout_rate: float = 0.1,
        attention_dropout_rate: float = 0.0,
        normalize_before: bool = True,
        activation_type: str = "swish",
        *,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        given = {
            "input_layer": input_layer,
            "pos_enc_layer_type": pos_enc_layer_type,
            "selfattention_layer_type": selfattention_layer_type,
            "activation_type": activation_type,
            "normalize_before": normalize_before,
        }
        for name, want in _SUPPORTED_OPTIONS.items():
            if given[name] != want:
                raise ValueError(
                    f"UpsampleConformerEncoderV2: {name}={given[name]!r} is not supported by the in-tree "
                    f"encoder (only {want!r}, the Step-Audio2 / MiniCPM-o flow.yaml value)"
                )
        self._output_size = output_size

        def layer() -> ConformerEncoderLayer:
            return ConformerEncoderLayer(
                output_size,
                RelPositionMultiHeadedAttention(
                    attention_heads, output_size, attention_dropout_rate, key_bias, dtype=dtype
                ),
                PositionwiseFeedForward(output_size, linear_units, dropout_rate, dtype=dtype),
                dropout_rate,
                dtype=dtype,
            )

        pos = EspnetRelPositionalEncoding(output_size, positional_dropout_rate, dtype=dtype)
        self.embed = LinearEmbed(input_size, output_size, dropout_rate, pos, dtype=dtype)
        self.after_norm = nn.LayerNorm(output_size, eps=1e-5, dtype=dtype)
        self.pre_lookahead_layer = PreLookaheadLayer(output_size, pre_lookahead_len, dtype=dtype)
        self.encoders = nn.ModuleList([layer() for _ in range(num_blocks)])
        self.up_layer = Upsample1D(output_size, output_size, up_stride, up_scale_factor, dtype=dtype)
        up_pos = EspnetRelPositionalEncoding(output_size, positional_dropout_rate, dtype=dtype)
        self.up_embed = LinearEmbed(input_size, output_size, dropout_rate, up_pos, dtype=dtype)
        self.up_encoders = nn.ModuleList([layer() for _ in range(num_up_blocks)])

    def output_size(self) -> int:
        return self._output_size

    @property
    def cnn_cache_frames(self) -> int:
        return 2 + 2 * self.up_layer.stride

    def forward(self, xs: torch.Tensor, xs_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """xs `(B, T, input_size)`, xs_lens `(B,)` -> (`(B, up * T, output_size)`, mask `(B, 1, up * T)`)."""
        mask = _pad_mask(xs_lens, xs.size(1))
        xs, pos_emb = self.embed(xs)
        xs = self.pre_lookahead_layer(xs)
        for layer in self.encoders:
            xs, _ = layer(xs, mask, pos_emb)
        up, up_lens = self.up_layer(xs.transpose(1, 2), xs_lens)
        xs = up.transpose(1, 2)
        mask = _pad_mask(up_lens, xs.size(1))
        xs, pos_emb = self.up_embed(xs)
        for layer in self.up_encoders:
            xs, _ = layer(xs, mask, pos_emb)
        return self.after_norm(xs), mask

    def forward_chunk(
        self,
        xs: torch.Tensor,
        last_chunk: bool = False,
        cnn_cache: torch.Tensor | None = None,
        att_cache: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One streaming chunk; see the module docstring for the cache layouts.

        xs `(B, T, input_size)` (token embeddings, lookahead included unless `last_chunk`).
        Returns mel-rate features `(B, up * T', C)` with `T' = T - L` (or T for the last chunk),
        the new cnn cache and the new att cache (fresh tensors).
        """
        n1 = len(self.encoders)
        stride = self.up_layer.stride
        if cnn_cache is not None and cnn_cache.size(2) != self.cnn_cache_frames:
            raise ValueError(
                f"flow encoder: conformer cnn cache has {cnn_cache.size(2)} frames, expected {self.cnn_cache_frames}"
            )
        if att_cache is not None and att_cache.size(3) % stride:
            raise ValueError(
                f"flow encoder: conformer att cache length {att_cache.size(3)} is not a multiple of {stride}; the "
                f"token-rate layers are stored tiled x{stride}"
            )
        offset1 = att_cache.size(3) // stride if att_cache is not None else 0

        xs, _ = self.embed(xs)
        if last_chunk:
            xs = F.pad(xs, (0, 0, 0, self.pre_lookahead_layer.pre_lookahead_len))
        xs, new_cnn1 = self.pre_lookahead_layer.forward_chunk(xs, None if cnn_cache is None else cnn_cache[:, :, :2])

        pos_emb = self.embed.position_encoding(offset1 + xs.size(1))
        new_att1 = []
        for idx, layer in enumerate(self.encoders):
            cache = None if att_cache is None else att_cache[idx, :, :, :offset1]
            xs, c = layer(xs, None, pos_emb, cache)
            new_att1.append(c)

        up, new_cnn2 = self.up_layer.forward_chunk(
            xs.transpose(1, 2), None if cnn_cache is None else cnn_cache[:, :, 2:]
        )
        xs, _ = self.up_embed(up.transpose(1, 2))
        # The reference builds the mel-rate table from `embed` too; both tables are identical.
        pos_emb = self.embed.position_encoding(offset1 * stride + xs.size(1))
        new_att2 = []
        for idx, layer in enumerate(self.up_encoders):
            cache = None if att_cache is None else att_cache[n1 + idx]
            xs, c = layer(xs, None, pos_emb, cache)
            new_att2.append(c)
        xs = self.after_norm(xs)

        token_rate = torch.stack(new_att1, dim=0)
        new_att = torch.cat([token_rate.repeat(1, 1, 1, stride, 1), torch.stack(new_att2, dim=0)], dim=0)
        new_cnn = torch.cat([new_cnn1, new_cnn2], dim=2)
        return xs, new_cnn, new_att
