# SPDX-License-Identifier: Apache-2.0
"""The conformer encoder's streaming chunk (`UpsampleConformerEncoderV2.forward_chunk`) for many rows at once.

Per row this is exactly the reference chunk: embed, zero lookahead for a last chunk, pre-lookahead
convolutions with the cached conv1 outputs, the token-rate conformer layers against the row's
cached keys/values, nearest x2 upsampling with its cached frames, the mel-rate layers, after_norm.

Sharing across rows (see `ragged.py`): the frames of all rows are concatenated along time; the
embeddings, LayerNorms, feed-forward blocks and residuals run once over all of them; the three
causal/valid convolutions run once over the interleaved `[ctx_i | x_i]` sequence. Attention does
not: the relative-position self-attention's `rel_shift` depends on the total key length, so keys
are never padded. Rows with equal (frames, cached frames) are stacked into one call of the
layer's own attention module (same key length, same positional table); any other row runs alone.

Positional tables are sliced per row group (`offset + frames` positions), never over the
concatenation, so a launch's total length is not limited by the 5000-position table; each row
still is (checked by the caller before launch, see `batched.check_chunk`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vllm_omni.model_executor.models.cosyvoice2.flow.batched_estimator import attention_groups
from vllm_omni.model_executor.models.cosyvoice2.flow.encoder import (
    ConformerEncoderLayer,
    LinearEmbed,
    UpsampleConformerEncoderV2,
)
from vllm_omni.model_executor.models.cosyvoice2.flow.ragged import RaggedConv, RaggedLayout


@dataclass(frozen=True)
class EncoderOut:
    """Mel-rate hidden states of all rows `[1, layout.total, C]` and each row's next conformer caches."""

    hidden: torch.Tensor
    layout: RaggedLayout
    cnn: list[torch.Tensor]  # (1, C, 2 + 2 stride) per row
    att: list[torch.Tensor]  # (blocks + up_blocks, 1, heads, 2 t, 2 d_k) per row, untrimmed


def _embed(embed: LinearEmbed, x: torch.Tensor) -> torch.Tensor:
    """`embed(x)[0]` without slicing a positional table over the (concatenated) length."""
    return embed.pos_enc.dropout(embed.out(x) * embed.pos_enc.xscale)


def _layers(
    layers: Sequence[torch.nn.Module],
    x: torch.Tensor,
    layout: RaggedLayout,
    caches: Sequence[Sequence[torch.Tensor | None]],
    offsets: Sequence[int],
    position_encoding: object,
) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    """Conformer layers over all rows. `caches[row][layer]` is `(1, H, offset, 2 d_k)` or None.

    Returns the output and `new[row][layer]` caches `(1, H, offset + frames, 2 d_k)`.
    """
    groups = attention_groups(layout.lengths, offsets)
    new: list[list[torch.Tensor]] = [[] for _ in range(layout.rows)]
    for index, module in enumerate(layers):
        layer = module
        assert isinstance(layer, ConformerEncoderLayer)
        normed = layer.norm_mha(x)
        att_out = torch.zeros_like(x)
        for group in groups:
            g, t, off = group.count, group.frames, group.cache
            start = layout.offsets[group.first]
            xs = normed[:, start : start + g * t].reshape(g, t, normed.shape[2])
            rows = range(group.first, group.first + g)
            cache = None
            if off > 0:
                parts = [caches[row][index] for row in rows]
                cache = parts[0] if g == 1 else torch.cat(parts, dim=0)  # type: ignore[arg-type]
            pos_emb = position_encoding(off + t)  # type: ignore[operator]
            out, c = layer.self_attn(xs, None, pos_emb, cache)
            att_out[:, start : start + g * t] = out.reshape(1, g * t, out.shape[2])
            for j, row in enumerate(rows):
                new[row].append(c[j : j + 1])
        x = x + layer.dropout(att_out)
        x = x + layer.dropout(layer.feed_forward(layer.norm_ff(x)))
    return x, new


@torch.inference_mode()
def encoder_chunks(
    encoder: UpsampleConformerEncoderV2,
    embeds: torch.Tensor,
    layout: RaggedLayout,
    last: Sequence[bool],
    cnn: Sequence[torch.Tensor | None],
    att: Sequence[torch.Tensor | None],
) -> EncoderOut:
    """One streaming chunk per row. embeds `[1, sum T_i, input_size]`: row i's token embeddings (its
    lookahead included unless `last[i]`), laid out by `layout` (no padding; the flow pads later)."""
    rows = layout.rows
    if len(last) != rows or len(cnn) != rows or len(att) != rows:
        raise ValueError(f"encoder_chunks: {rows} rows but {len(last)} flags, {len(cnn)} / {len(att)} caches")
    if layout.pad:
        raise ValueError("encoder_chunks: the encoder layout carries no padding frames")
    device = embeds.device
    lookahead = encoder.pre_lookahead_layer.pre_lookahead_len
    stride = encoder.up_layer.stride
    n1 = len(encoder.encoders)
    for i, c in enumerate(cnn):
        if c is not None and c.shape[2] != encoder.cnn_cache_frames:
            raise ValueError(
                f"flow encoder: row {i} conformer cnn cache has {c.shape[2]} frames, "
                f"expected {encoder.cnn_cache_frames}"
            )
    offsets = []
    for i, a in enumerate(att):
        if a is not None and a.shape[3] % stride:
            raise ValueError(
                f"flow encoder: row {i} conformer att cache length {a.shape[3]} is not a multiple of {stride}"
            )
        offsets.append(a.shape[3] // stride if a is not None else 0)

    xs = _embed(encoder.embed, embeds)  # [1, sum T, C]
    # Last chunks get `lookahead` zero frames after their embedded tokens (the reference's F.pad).
    padded = tuple(n + (lookahead if is_last else 0) for n, is_last in zip(layout.lengths, last, strict=True))
    if any(last):
        zero = xs.shape[1]
        index: list[int] = []
        for i, is_last in enumerate(last):
            span = layout.span(i)
            index += list(range(span.start, span.stop)) + ([zero] * lookahead if is_last else [])
        source = torch.cat([xs, xs.new_zeros(1, 1, xs.shape[2])], dim=1)
        xs = source.index_select(1, torch.tensor(index, dtype=torch.long).to(device, non_blocking=True))
    in_layout = RaggedLayout(padded)

    # Pre-lookahead layer: valid conv1 (kernel L + 1) per row, leaky ReLU, causal conv2 with 2 cached frames.
    pre = encoder.pre_lookahead_layer
    conv1 = RaggedConv(in_layout, pre.conv1.kernel_size[0], 0, device)
    h, _ = conv1(pre.conv1, xs.transpose(1, 2))
    h = F.leaky_relu(h)
    tok_layout = conv1.out_layout  # T'_i = T_i (+ L) - L frames per row
    conv2 = RaggedConv(tok_layout, pre.conv2.kernel_size[0], 2, device, keep_context=2)
    ctx = _context([None if c is None else c[:, :, :2] for c in cnn], 2, h)
    h, new_cnn1 = conv2(pre.conv2, h, ctx)
    keep = []
    for i in range(rows):
        span = in_layout.span(i)
        keep += list(range(span.start, span.start + tok_layout.lengths[i]))
    residual = xs.index_select(1, torch.tensor(keep, dtype=torch.long).to(device, non_blocking=True))
    h = h.transpose(1, 2) + residual

    token_caches = [[None if a is None else a[idx, :, :, : offsets[i]] for idx in range(n1)] for i, a in enumerate(att)]
    h, new_att1 = _layers(encoder.encoders, h, tok_layout, token_caches, offsets, encoder.embed.position_encoding)

    # Nearest x2 upsampling is per frame; the causal conv sees 2 * stride cached upsampled frames.
    up = F.interpolate(h.transpose(1, 2), scale_factor=encoder.up_layer.scale_factor, mode="nearest")
    mel_layout = tok_layout.scaled(stride)
    up_conv = RaggedConv(mel_layout, encoder.up_layer.conv.kernel_size[0], 2 * stride, device, keep_context=2 * stride)
    ctx = _context([None if c is None else c[:, :, 2:] for c in cnn], 2 * stride, up)
    up, new_cnn2 = up_conv(encoder.up_layer.conv, up, ctx)
    h = _embed(encoder.up_embed, up.transpose(1, 2))
    mel_caches = [[None if a is None else a[n1 + idx] for idx in range(len(encoder.up_encoders))] for a in att]
    mel_offsets = [o * stride for o in offsets]
    h, new_att2 = _layers(encoder.up_encoders, h, mel_layout, mel_caches, mel_offsets, encoder.embed.position_encoding)
    h = encoder.after_norm(h)

    assert new_cnn1 is not None and new_cnn2 is not None
    cnn1 = new_cnn1.reshape(1, new_cnn1.shape[1], rows, 2)
    cnn2 = new_cnn2.reshape(1, new_cnn2.shape[1], rows, 2 * stride)
    new_cnn = [torch.cat([cnn1[:, :, i], cnn2[:, :, i]], dim=2) for i in range(rows)]
    new_att = []
    for i in range(rows):
        token_rate = torch.stack(new_att1[i], dim=0)
        new_att.append(torch.cat([token_rate.repeat(1, 1, 1, stride, 1), torch.stack(new_att2[i], dim=0)], dim=0))
    return EncoderOut(hidden=h, layout=mel_layout, cnn=new_cnn, att=new_att)


def _context(parts: Sequence[torch.Tensor | None], frames: int, like: torch.Tensor) -> torch.Tensor:
    """Per-row cached frames `(1, C, frames)` (zeros for a fresh stream) as `[1, C, rows * frames]`."""
    zeros = like.new_zeros(1, like.shape[1], frames)
    return torch.cat([zeros if p is None else p.to(like.dtype) for p in parts], dim=2)


__all__ = ["EncoderOut", "encoder_chunks"]
