# SPDX-License-Identifier: Apache-2.0
"""Rows of different lengths laid end to end on one time axis, and causal convolutions over them.

The batched estimator (`batched_estimator.py`) runs the chunks of several requests in one launch.
Everything in the DiT except attention and the causal convolutions is per frame (Linear,
LayerNorm, modulation, MLP, activations), so the frames of all rows are concatenated along time and
those ops run once on `[B, sum T_i, C]` ("ragged"): no padding, no copy of any row's cache, and a
row's frames see the arithmetic of a batch-1 call. Attention is done per group of rows with equal
shapes by the kernel.

A causal convolution with kernel k needs k - 1 frames of left context per row (its cached frames).
`RaggedConv` runs it as ONE convolution over the interleaved sequence

    [ctx_0 | x_0 | ctx_1 | x_1 | ... ]            (ctx_i: K cached frames of row i)

and keeps, for row i, the outputs whose receptive field lies inside `[ctx_i | x_i]`; outputs that
straddle two rows are computed and dropped. With K = k - 1 that is exactly the reference's
`conv(cat([cache, x]))` per row; with K = 0 it is a "valid" convolution of each row on its own.
The gather indices are plain host integers turned into device tensors once per launch, so the
convolution itself never synchronises the host.

Static shapes (`context_rows`): a captured device graph needs the same tensor shapes for every
launch it serves, but the interleaved sequence and the context tensors grow with the row count.
With `context_rows=R` (>= the rows) the context tensor always holds R rows (rows beyond the
layout's are ignored), the interleaved sequence is filled up to `total + K (R + 1)` frames with zero
frames (their outputs are computed and not selected) and `R` next contexts are returned (rows
beyond the layout's are garbage the caller drops). Every index tensor's length then depends only
on `total` and R, so one graph per bucketed `total` serves any mix of rows. Selected outputs are
the same values either way (a convolution output depends only on its receptive field).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class RaggedLayout:
    """Row i owns frames `[offsets[i], offsets[i] + lengths[i])`; `pad` dummy frames follow the last row.

    Padding frames belong to no row: per-frame ops compute garbage there, attention never reads
    them and the kernels drop their outputs, so they only exist to give a launch a bucketed shape
    (graph capture). Lengths may be 0 (a row that contributes no frames).
    """

    lengths: tuple[int, ...]
    pad: int = 0

    def __post_init__(self) -> None:
        if any(n < 0 for n in self.lengths) or self.pad < 0:
            raise ValueError(f"RaggedLayout: lengths and pad must be >= 0, got {self.lengths} / {self.pad}")

    @cached_property
    def offsets(self) -> tuple[int, ...]:
        out, start = [], 0
        for n in self.lengths:
            out.append(start)
            start += n
        return tuple(out)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def frames(self) -> int:
        """Frames of the rows, without padding."""
        return sum(self.lengths)

    @property
    def total(self) -> int:
        """Frames including padding: the launch's time dimension."""
        return self.frames + self.pad

    def span(self, row: int) -> slice:
        return slice(self.offsets[row], self.offsets[row] + self.lengths[row])

    def split(self, x: torch.Tensor, dim: int) -> list[torch.Tensor]:
        """Per-row views of `x` along `dim` (padding dropped)."""
        return [x.narrow(dim, self.offsets[i], self.lengths[i]) for i in range(self.rows)]

    def with_pad(self, pad: int) -> RaggedLayout:
        return RaggedLayout(self.lengths, pad)

    def scaled(self, factor: int) -> RaggedLayout:
        """The layout after a per-frame x`factor` upsampling (each frame becomes `factor` frames)."""
        return RaggedLayout(tuple(n * factor for n in self.lengths), self.pad * factor)


def _device_index(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)


@dataclass(frozen=True)
class ConvIndices:
    """The gather plan of one `RaggedConv` as device tensors (what a captured graph takes as inputs).

    `interleave` builds `[ctx_0 | x_0 | ...]` from `cat([x, context, one zero frame])`; `outputs`
    picks each row's conv outputs; `contexts` picks each row's next context (empty: none kept).
    """

    interleave: torch.Tensor
    outputs: torch.Tensor
    contexts: torch.Tensor

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.interleave, self.outputs, self.contexts


def ragged_conv1d(
    conv: nn.Conv1d, x: torch.Tensor, context: torch.Tensor | None, indices: ConvIndices
) -> tuple[torch.Tensor, torch.Tensor]:
    """`conv` over the interleaved rows of x `[B, C, total]` and their contexts `[B, C, R K]` (see `RaggedConv`).

    Returns (outputs `[B, C', len(outputs)]`, next contexts `[B, C, len(contexts)]`). Shapes come
    from the tensors only (no host integers), so a graph captured on one plan replays any plan of
    the same shapes.
    """
    parts = [x] if context is None else [x, context.to(x.dtype)]
    parts.append(x.new_zeros(x.shape[0], x.shape[1], 1))  # the zero frame of padding segments / filler
    seq = torch.cat(parts, dim=2).index_select(2, indices.interleave)
    y = F.conv1d(seq, conv.weight, conv.bias, 1, 0, 1, conv.groups)
    return y.index_select(2, indices.outputs), seq.index_select(2, indices.contexts)


class RaggedConv:
    """Gather plans for one causal/valid Conv1d (kernel `k`, stride 1, no padding) over a ragged layout.

    `context_frames` (K) is how many cached frames precede each row (0: none, a "valid" convolution
    whose rows shrink by k - 1 frames). `keep_context` is how many trailing frames of each row's
    `[ctx | x]` to return as its next context. `context_rows` (R >= rows) fixes the shapes for graph
    capture (module docstring). Build one per launch and reuse it for every call with the same
    layout (all blocks, all Euler steps).
    """

    def __init__(
        self,
        layout: RaggedLayout,
        kernel_size: int,
        context_frames: int,
        device: torch.device,
        *,
        keep_context: int = 0,
        context_rows: int | None = None,
    ) -> None:
        if kernel_size < 1 or context_frames < 0 or keep_context < 0:
            raise ValueError(f"RaggedConv: bad kernel {kernel_size} / context {context_frames} / keep {keep_context}")
        if context_rows is not None and context_rows < layout.rows:
            raise ValueError(f"RaggedConv: context_rows {context_rows} is fewer than the layout's {layout.rows} rows")
        self.layout = layout
        self.kernel_size = kernel_size
        self.context_frames = context_frames
        self.keep_context = keep_context
        self.context_rows = layout.rows if context_rows is None else context_rows
        k, ctx = kernel_size, context_frames
        # The padding frames are one more segment (zero context) so every real row stays exact.
        lengths = list(layout.lengths) + ([layout.pad] if layout.pad else [])
        interleave: list[int] = []
        outputs: list[int] = []
        contexts: list[int] = []
        out_lengths: list[int] = []
        src_offset, pos = 0, 0
        zero = layout.total + ctx * self.context_rows  # index of the zero frame appended after all contexts
        for row, n in enumerate(lengths):
            real = row < layout.rows
            seg = ctx + n
            if real:
                interleave += [layout.total + row * ctx + j for j in range(ctx)]
            else:
                interleave += [zero] * ctx
            interleave += list(range(src_offset, src_offset + n))
            n_out = seg - k + 1
            if real and n_out < 0:
                raise ValueError(f"RaggedConv: row {row} has {n} frames + {ctx} context, fewer than the kernel's {k}")
            n_out = max(n_out, 0)
            outputs += list(range(pos, pos + n_out))
            if real:
                out_lengths.append(n_out)
                if keep_context:
                    if seg < keep_context:
                        raise ValueError(
                            f"RaggedConv: row {row} has {seg} frames with context, cannot keep {keep_context}"
                        )
                    contexts += list(range(pos + seg - keep_context, pos + seg))
            pos += seg
            src_offset += n
        if context_rows is not None:
            # Fixed shapes: filler zero frames up to total + K (R + 1), garbage contexts for absent rows.
            interleave += [zero] * (layout.total + ctx * (self.context_rows + 1) - pos)
            if keep_context:
                contexts += [0] * (keep_context * (self.context_rows - layout.rows))
        self.input_frames = len(interleave)
        pad_out = (ctx + layout.pad - k + 1) if layout.pad else 0
        self.out_layout = RaggedLayout(tuple(out_lengths), max(pad_out, 0))
        self.indices = ConvIndices(
            _device_index(interleave, device), _device_index(outputs, device), _device_index(contexts, device)
        )

    def interleave(self, x: torch.Tensor, context: torch.Tensor | None) -> torch.Tensor:
        """`[ctx_0 | x_0 | ctx_1 | x_1 | ...]` from x `[B, C, total]` and context `[B, C, context_rows * K]`."""
        self._check_context(context)
        parts = [x] if context is None else [x, context.to(x.dtype)]
        parts.append(x.new_zeros(x.shape[0], x.shape[1], 1))
        return torch.cat(parts, dim=2).index_select(2, self.indices.interleave)

    def _check_context(self, context: torch.Tensor | None) -> None:
        want = self.context_rows * self.context_frames
        if (want and (context is None or context.shape[-1] != want)) or (not want and context is not None):
            got = None if context is None else tuple(context.shape)
            raise ValueError(
                f"RaggedConv: context must be [B, C, {self.context_rows} x {self.context_frames}], got {got}"
            )

    def __call__(
        self, conv: nn.Conv1d, x: torch.Tensor, context: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(conv outputs `[B, C', out_layout.total]`, next contexts `[B, C, context_rows * keep]` or None)."""
        if (
            conv.kernel_size[0] != self.kernel_size
            or conv.stride[0] != 1
            or conv.padding[0] != 0
            or conv.dilation[0] != 1
        ):
            raise ValueError(
                f"RaggedConv: planned for kernel {self.kernel_size}, stride 1, no padding, no dilation; got "
                f"{conv.kernel_size}, {conv.stride}, {conv.padding}, {conv.dilation}"
            )
        self._check_context(context)
        out, ctx = ragged_conv1d(conv, x, context if self.context_frames else None, self.indices)
        return out, ctx if self.keep_context else None


__all__ = ["ConvIndices", "RaggedConv", "RaggedLayout", "ragged_conv1d"]
