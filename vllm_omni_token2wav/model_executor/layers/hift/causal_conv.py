# SPDX-License-Identifier: Apache-2.0
"""Causal convolutions of the causal HiFT vocoder, usable whole or chunk by chunk.

CosyVoice3's vocoder (`CausalHiFTGenerator`) replaces every symmetric convolution of HiFT by one
that reads only the past, except two that read a fixed number of future frames. Run once over a
whole utterance, a causal convolution pads zeros on the left, as the reference does. Run chunk by
chunk, the zeros are replaced by the inputs the same convolution saw at the end of the previous
chunk; the output of every chunk is then the slice of the whole-utterance output at the same
positions, and each chunk costs only its own length.

The contexts travel in a `ContextCarry`: it reads the previous step's contexts (never mutating
them) and collects the next ones, keyed by the convolution's module name (`carry_key`, set by the
owning generator), so a failed step leaves the previous contexts intact.

| module                 | reference (CosyVoice `transformer/convolution.py`)       | output t reads          |
|------------------------|----------------------------------------------------------|-------------------------|
| `CausalConv1d`         | `CausalConv1d(causal_type='left')`, `...DownSample`      | `left_pad` past inputs  |
| `LookaheadConv1d`      | `CausalConv1d(causal_type='right')`                      | t and k - 1 future ones |
| `CausalUpsampleConv1d` | `CausalConv1dUpsample`                                   | nearest x u, k - 1 past |

Left pads: `(k - 1) * d` for stride 1 (the reference's `int((k*d - d)/2)*2 + (k+1)%2`, which is
the same number for every odd kernel and for even kernels at d = 1), `stride - 1` for the strided
source convolutions (kernel 2 x stride).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn


class ContextCarry:
    """Left contexts of the causal convolutions between two streaming steps.

    `previous` maps `carry_key` -> the trailing inputs of that convolution at the end of the last
    step; None (or a missing key) means the start of the signal, where zeros stand in. Contexts
    written during this step are collected apart; `contexts()` returns the mapping for the next step
    (previous ones that were not touched are carried over unchanged).
    """

    def __init__(self, previous: Mapping[str, torch.Tensor] | None = None) -> None:
        self._previous: Mapping[str, torch.Tensor] = previous if previous is not None else {}
        self._next: dict[str, torch.Tensor] = {}

    def take(self, key: str) -> torch.Tensor | None:
        """The context written by the previous step for `key` (None at the start of the signal)."""
        return self._previous.get(key)

    def keep(self, key: str, value: torch.Tensor) -> None:
        """Record `key`'s context for the next step (a private copy: no view into this step's buffers)."""
        if not key:
            raise RuntimeError("a causal convolution without carry_key cannot stream; set it from the module name")
        if key in self._next:
            raise RuntimeError(f"context {key!r} written twice in one step (the same module ran twice)")
        self._next[key] = value.clone()

    def keep_owned(self, key: str, value: torch.Tensor) -> None:
        """`keep` for a tensor the caller already owns (no copy; e.g. a graph replay's cloned output)."""
        if key in self._next:
            raise RuntimeError(f"context {key!r} written twice in one step (the same module ran twice)")
        self._next[key] = value

    def contexts(self) -> dict[str, torch.Tensor]:
        return {**self._previous, **self._next}


def causal_left_pad(kernel_size: int, dilation: int = 1) -> int:
    """Zeros a stride-1 causal convolution needs before the signal: (k - 1) * d."""
    if kernel_size % 2 == 0 and dilation != 1:
        # The reference formula and (k - 1) * d disagree here; no HiFT layer uses this shape.
        raise ValueError(f"causal conv with even kernel {kernel_size} and dilation {dilation} is not supported")
    return (kernel_size - 1) * dilation


class CausalConv1d(nn.Conv1d):
    """Conv1d over the past only: `left_pad` zeros (or the carried inputs) before the signal.

    Stride 1: output t reads inputs t - (k-1) d .. t. Strided (the source down-sampling, kernel
    2 s, stride s): left pad s - 1. Parameters and state_dict keys are those of `nn.Conv1d`.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        dilation: int = 1,
        *,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding=0, dilation=dilation, dtype=dtype)
        if stride == 1:
            self.left_pad = causal_left_pad(kernel_size, dilation)
        else:
            if dilation != 1 or kernel_size % stride:
                raise ValueError(f"strided causal conv needs dilation 1 and kernel % stride == 0, got {self}")
            self.left_pad = stride - 1
        self.carry_key = ""

    def forward(self, x: torch.Tensor, carry: ContextCarry | None = None) -> torch.Tensor:  # type: ignore[override]
        head = carry.take(self.carry_key) if carry is not None else None
        if head is None:
            head = x.new_zeros(x.shape[0], x.shape[1], self.left_pad)
        buffer = torch.cat([head, x], dim=-1) if head.shape[-1] else x
        out = self._conv_forward(buffer, self.weight, self.bias)
        if carry is not None:
            # What the next output's receptive field still needs: everything from its first input on.
            carry.keep(self.carry_key, buffer[..., out.shape[-1] * self.stride[0] :])
        return out


class CausalUpsampleConv1d(CausalConv1d):
    """Nearest up-sampling by `rate`, then a causal stride-1 conv (the causal HiFT's `ups[i]`).

    The reference applies `nn.Upsample(scale_factor=rate, mode='nearest')`; for integer factors that
    is `repeat_interleave`, which is what runs here (chunk by chunk it gives the same samples).
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, rate: int, *, dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, dtype=dtype)
        self.rate = rate

    def forward(self, x: torch.Tensor, carry: ContextCarry | None = None) -> torch.Tensor:  # type: ignore[override]
        return super().forward(torch.repeat_interleave(x, self.rate, dim=-1), carry)


class LookaheadConv1d(nn.Conv1d):
    """Conv1d whose output frame t reads frames t .. t + k - 1 (no past).

    `finalize=True`: zeros stand for the frames after the end of the signal (output length = input
    length). `finalize=False`: the caller's last `lookahead` frames are real future frames and only
    the frames before them are produced (output length = input length - lookahead).
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, *, dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, padding=0, dtype=dtype)
        self.lookahead = kernel_size - 1

    def forward(self, x: torch.Tensor, finalize: bool = True) -> torch.Tensor:  # type: ignore[override]
        if finalize:
            x = F.pad(x, (0, self.lookahead))
        return self._conv_forward(x, self.weight, self.bias)


def assign_carry_keys(module: nn.Module) -> None:
    """Name every causal conv of `module` after its path (`resblocks.3.convs1.2`), the key of its context."""
    for name, child in module.named_modules():
        if isinstance(child, CausalConv1d):
            child.carry_key = name
