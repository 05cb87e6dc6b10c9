# SPDX-License-Identifier: Apache-2.0
"""The parts HiFT (CosyVoice2 / Step-Audio2) and CosyVoice3's causal HiFT have in common.

Both vocoders are built from the same blocks under the same parameter names (so both `hift.pt`
layouts load through one loader): Snake activations, dilated residual blocks, a 5-layer conv F0
predictor with a linear classifier, and an iSTFT head (16-point STFT of the excitation in,
log-magnitude / phase out). They differ only in how the convolutions see time: symmetric padding
in HiFT, left padding (or a carried context, `causal_conv.ContextCarry`) in the causal one. This
module holds one implementation of each block with a `causal` switch where the two differ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from torch import nn

from vllm_omni_token2wav.model_executor.layers.hift.causal_conv import (
    CausalConv1d,
    ContextCarry,
    LookaheadConv1d,
)

if TYPE_CHECKING:
    from vllm_omni_token2wav.model_executor.layers.hift.config import HiFTConfig


def same_padding(kernel_size: int, dilation: int) -> int:
    """Symmetric padding that keeps the length of an odd-kernel conv: (k d - d) / 2."""
    return (kernel_size * dilation - dilation) // 2


class Snake(nn.Module):
    """Snake activation x + sin^2(alpha x) / (alpha + 1e-9), per-channel alpha (linear scale). Key: `alpha`."""

    def __init__(self, channels: int, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha[None, :, None]
        return x + (1.0 / (alpha + 1e-9)) * torch.sin(x * alpha).pow(2)


class ResBlock(nn.Module):
    """Dilated residual block: for each dilation d, x += conv2(snake(conv1_d(snake(x)))).

    `causal=False`: symmetric padding (HiFT). `causal=True`: every conv pads (k - 1) d on the left,
    or reads the previous chunk's inputs from `carry` (CosyVoice3's causal HiFT).
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int,
        dilations: tuple[int, ...],
        *,
        causal: bool = False,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.causal = causal

        def conv(dilation: int) -> nn.Conv1d:
            if causal:
                return CausalConv1d(channels, channels, kernel_size, dilation=dilation, dtype=dtype)
            padding = same_padding(kernel_size, dilation)
            return nn.Conv1d(channels, channels, kernel_size, 1, dilation=dilation, padding=padding, dtype=dtype)

        self.convs1 = nn.ModuleList(conv(d) for d in dilations)
        self.convs2 = nn.ModuleList(conv(1) for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(channels, dtype=dtype) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels, dtype=dtype) for _ in dilations)

    def _conv(
        self, conv: nn.Module, x: torch.Tensor, carry: ContextCarry | None, mask: torch.Tensor | None
    ) -> torch.Tensor:
        y = conv(x, carry) if self.causal else conv(x)
        return y if mask is None else y.mul_(mask)

    def forward(
        self, x: torch.Tensor, carry: ContextCarry | None = None, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`mask` [B, 1, T] (1.0 on each row's frames, 0.0 on its right padding; non-causal only) zeroes
        every conv output past a row's end, so a right-padded row computes exactly its unpadded result
        (Snake(0) = 0; the next conv reads zeros where the unpadded call reads its zero padding)."""
        if carry is not None and not self.causal:
            raise ValueError("a non-causal ResBlock cannot stream with a ContextCarry")
        for conv1, conv2, act1, act2 in zip(
            self.convs1, self.convs2, self.activations1, self.activations2, strict=True
        ):
            x = x + self._conv(conv2, act2(self._conv(conv1, act1(x), carry, mask)), carry, mask)
        return x


class ConvRNNF0Predictor(nn.Module):
    """F0 from mel: 5 x [Conv1d k3 -> ELU] (`condnet.{0,2,4,6,8}`) -> Linear(C, 1) (`classifier`) -> abs.

    `causal=True` is the reference's `CausalConvRNNF0Predictor`: `condnet.0` has kernel 4 and reads
    the frame plus 3 future frames (`LookaheadConv1d`), the other four read 2 past frames each
    (8 frames of left context in all).
    """

    def __init__(
        self,
        in_channels: int,
        cond_channels: int,
        num_layers: int,
        *,
        causal: bool = False,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.causal = causal
        layers: list[nn.Module] = []
        for i in range(num_layers):
            cin = in_channels if i == 0 else cond_channels
            if not causal:
                layers.append(nn.Conv1d(cin, cond_channels, 3, padding=1, dtype=dtype))
            elif i == 0:
                layers.append(LookaheadConv1d(cin, cond_channels, 4, dtype=dtype))
            else:
                layers.append(CausalConv1d(cin, cond_channels, 3, dtype=dtype))
            layers.append(nn.ELU())
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, 1, dtype=dtype)

    @property
    def lookahead(self) -> int:
        """Future mel frames one F0 frame reads (3 causal, 1 non-causal)."""
        first = self.condnet[0]
        return first.lookahead if isinstance(first, LookaheadConv1d) else 1

    def forward(self, mel: torch.Tensor, carry: ContextCarry | None = None, finalize: bool = True) -> torch.Tensor:
        """mel [B, 80, T] -> f0 [B, T'] (Hz, non-negative), in the predictor's dtype.

        Causal: T' = T when `finalize` (zeros after the end), else T - 3 (the last 3 frames are
        look-ahead); `carry` streams the left contexts. Non-causal: T' = T, no carry.
        """
        if not self.causal:
            if carry is not None or not finalize:
                raise ValueError("the non-causal F0 predictor has no streaming mode")
            hidden = self.condnet(mel)
        else:
            hidden = mel
            for layer in self.condnet:
                if isinstance(layer, LookaheadConv1d):
                    hidden = layer(hidden, finalize)
                elif isinstance(layer, CausalConv1d):
                    hidden = layer(hidden, carry)
                else:
                    hidden = layer(hidden)
        return torch.abs(self.classifier(hidden.transpose(1, 2)).squeeze(-1))


def hann_window(n_fft: int) -> torch.Tensor:
    """Periodic Hann computed in float64 then rounded to float32, like scipy's `get_window("hann", n_fft)`."""
    return torch.hann_window(n_fft, periodic=True, dtype=torch.float64, device="cpu").to(torch.float32)


def stft_channels(x: torch.Tensor, n_fft: int, hop: int, window: torch.Tensor, *, center: bool = True) -> torch.Tensor:
    """[B, L] -> [B, n_fft + 2, frames]: real parts then imaginary parts of the one-sided STFT.

    `center=True` (the reference) reflect-pads n_fft / 2 samples on both sides; the streaming
    vocoder pads itself and frames with `center=False`, which yields the same frames.
    """
    spec = torch.stft(
        x,
        n_fft,
        hop,
        n_fft,
        window=window.to(x.dtype),
        center=center,
        pad_mode="reflect",
        return_complex=True,
    )
    spec = torch.view_as_real(spec)
    return torch.cat([spec[..., 0], spec[..., 1]], dim=1)


def istft_head(x: torch.Tensor, n_fft: int, hop: int, window: torch.Tensor) -> torch.Tensor:
    """conv_post output [B, n_fft + 2, frames] -> waveform [B, hop * (frames - 1)] (not clamped).

    Channels 0..n_fft/2 are log-magnitudes (exp, clipped at 100), the rest phases through sin (the
    reference's "actually, sin is redundancy"); centred iSTFT with the analysis window.
    """
    bins = n_fft // 2 + 1
    magnitude = torch.clip(torch.exp(x[:, :bins, :]), max=1e2)
    phase = torch.sin(x[:, bins:, :])
    spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
    return centred_istft(spec, n_fft, hop, window.to(magnitude.dtype))


def centred_istft(spec: torch.Tensor, n_fft: int, hop: int, window: torch.Tensor) -> torch.Tensor:
    """`torch.istft(spec, n_fft, hop, n_fft, window=window)` (centred, onesided) without its host-side check.

    The same aten operations in the same order as torch 2.13's istft (inverse real FFT of each frame,
    times the window, overlap-add, trimmed by n_fft / 2 at both ends, divided by the overlap-added
    squared window), so the samples are bit-identical (tested). What is left out is istft's check that
    the window envelope never vanishes (NOLA): it reads a device value back (`aten.equal`), which
    stalls the launching thread on every vocoder call and cannot be inside a captured graph. The
    windows used here (periodic Hann, hop <= n_fft / 4) satisfy it for every frame count.
    """
    frames = spec.shape[-1]
    length = n_fft + hop * (frames - 1)
    signal = torch.fft.irfft(spec.transpose(1, 2), n=n_fft, dim=-1) * window.view(1, 1, n_fft)
    signal = torch.ops.aten.unfold_backward(signal, [spec.shape[0], length], 1, n_fft, hop)
    envelope = window.pow(2).expand(1, frames, n_fft)
    envelope = torch.ops.aten.unfold_backward(envelope, [1, length], 1, n_fft, hop)
    half = n_fft // 2
    return signal[:, half : length - half] / envelope[:, half : length - half]


class HiFTBase(nn.Module):
    """The module tree both HiFT generators share; subclasses add conv_pre, ups, source_downs, conv_post.

    Holds the residual blocks of the three up-sampling stages (`resblocks`: 3 kernels per stage)
    and of the source branch (`source_resblocks`), the F0 predictor and the STFT window, and knows
    which convolutions `hift.pt` stores as weight norm. `fuse` is the per-stage merge of the
    up-sampled mel path with the excitation's STFT, identical in both generators.
    """

    stft_window: torch.Tensor
    conv_pre: nn.Conv1d
    conv_post: nn.Conv1d
    ups: nn.ModuleList
    source_downs: nn.ModuleList

    def __init__(self, config: HiFTConfig, *, causal: bool, dtype: torch.dtype, f0_dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        stages = len(config.upsample_rates)
        self.source_resblocks = nn.ModuleList(
            ResBlock(config.stage_channels(i), k, tuple(d), causal=causal, dtype=dtype)
            for i, (k, d) in enumerate(
                zip(config.source_resblock_kernel_sizes, config.source_resblock_dilation_sizes, strict=True)
            )
        )
        self.resblocks = nn.ModuleList(
            ResBlock(config.stage_channels(i), k, tuple(d), causal=causal, dtype=dtype)
            for i in range(stages)
            for k, d in zip(config.resblock_kernel_sizes, config.resblock_dilation_sizes, strict=True)
        )
        self.f0_predictor = ConvRNNF0Predictor(
            config.in_channels, config.f0_channels, config.f0_layers, causal=causal, dtype=f0_dtype
        )
        # Non-persistent: the shipped state_dict has no window, and strict loading must stay strict.
        self.register_buffer("stft_window", hann_window(config.istft_n_fft), persistent=False)

    @staticmethod
    def source_down_rates(config: HiFTConfig) -> list[int]:
        """Stride of `source_downs[i]` over the source STFT frames (15, 3, 1 at 24 kHz).

        The source branch meets stage i at that stage's rate: the STFT has 120 frames per mel frame,
        the stages 8, 40 and 120.
        """
        rates = [1, *config.upsample_rates[::-1][:-1]]
        return [int(r) for r in np.cumprod(rates)[::-1]]

    @property
    def num_kernels(self) -> int:
        return len(self.config.resblock_kernel_sizes)

    def fuse(
        self,
        stage: int,
        x: torch.Tensor,
        source_down: torch.Tensor,
        carry: ContextCarry | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x + source_resblocks[stage](source_down), then the mean of the stage's residual blocks.

        `mask`: see `ResBlock.forward` (x and source_down must already be zero past each row's end).
        """
        x = x + self.source_resblocks[stage](source_down, carry, mask)
        first = stage * self.num_kernels
        acc = self.resblocks[first](x, carry, mask)
        for j in range(1, self.num_kernels):
            acc = acc + self.resblocks[first + j](x, carry, mask)
        return acc / self.num_kernels

    def check_mel(self, mel: torch.Tensor, *, allow_empty: bool = False) -> None:
        """Raise a ValueError naming the problem unless `mel` is a float [B, in_channels, T] tensor."""
        name = type(self).__name__
        if not isinstance(mel, torch.Tensor):
            raise ValueError(f"{name} expects a mel tensor [B, {self.config.in_channels}, T], got {type(mel).__name__}")
        if mel.dim() != 3 or mel.shape[1] != self.config.in_channels:
            raise ValueError(
                f"{name} expects mel [B, {self.config.in_channels}, T], got {tuple(mel.shape)}; "
                "is the flow output transposed ([B, T, 80])?"
            )
        if mel.shape[-1] < 1 and not allow_empty:
            raise ValueError(f"{name} got a mel with 0 frames; nothing to vocode")
        if not mel.is_floating_point():
            raise ValueError(f"{name} expects a floating-point mel, got {mel.dtype}")

    def weight_norm_modules(self) -> list[tuple[str, nn.Module]]:
        """The 82 (full size) modules whose `weight` is stored as weight norm (dim 0) in hift.pt."""
        names: list[tuple[str, nn.Module]] = [("conv_pre", self.conv_pre), ("conv_post", self.conv_post)]
        names += [(f"ups.{i}", m) for i, m in enumerate(self.ups)]
        for prefix, blocks in (("resblocks", self.resblocks), ("source_resblocks", self.source_resblocks)):
            for i, block in enumerate(cast(list[ResBlock], list(blocks))):
                for j, conv in enumerate(block.convs1):
                    names.append((f"{prefix}.{i}.convs1.{j}", conv))
                for j, conv in enumerate(block.convs2):
                    names.append((f"{prefix}.{i}.convs2.{j}", conv))
        for i, layer in enumerate(self.f0_predictor.condnet):
            if isinstance(layer, nn.Conv1d):
                names.append((f"f0_predictor.condnet.{i}", layer))
        return names
