# SPDX-License-Identifier: Apache-2.0
"""Building blocks of CAM++ with upstream's module names, so upstream checkpoints load strictly.

The attribute names below (`nonlinear.batchnorm`, `cam_layer.linear_local`, `shortcut.0`, ...)
are the state_dict keys of 3D-Speaker's CAM++ and of the torch-named initializers of the shipped
`campplus.onnx`; renaming any of them breaks `load_state_dict(strict=True)` and the ONNX loader.
Every module is built with explicit fp32 factory kwargs so construction never depends on
`torch.get_default_dtype()` (vLLM builds stages under a bf16 default).

The forward passes are the reference formulation (the graph the shipped file was exported from);
`campplus.inference` holds the faster, numerically equivalent eval-time form. The modules that
mix frames take an optional `FrameInfo` / frame mask for padded calls (`campplus.masking`); without
it they compute exactly upstream's graph.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.masking import FrameInfo, masked
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.pooling import (
    cam_context,
    frames_of_segments,
    statistics,
)
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.segpool import seg_pool

BN_EPS = 1e-5


def factory_kwargs(device: torch.device | str | None, dtype: torch.dtype) -> dict[str, Any]:
    return {"device": device, "dtype": dtype}


def get_nonlinear(config_str: str, channels: int, **fk: Any) -> nn.Sequential:
    """`"batchnorm-relu"` -> Sequential(batchnorm=BatchNorm1d, relu=ReLU); `batchnorm_` is BN without affine."""
    seq = nn.Sequential()
    for name in config_str.split("-"):
        if name == "relu":
            seq.add_module("relu", nn.ReLU(inplace=True))
        elif name == "prelu":
            seq.add_module("prelu", nn.PReLU(channels, **fk))
        elif name == "batchnorm":
            seq.add_module("batchnorm", nn.BatchNorm1d(channels, eps=BN_EPS, **fk))
        elif name == "batchnorm_":
            seq.add_module("batchnorm", nn.BatchNorm1d(channels, eps=BN_EPS, affine=False, **fk))
        else:
            raise ValueError(f"unknown nonlinearity {name!r} in config_str {config_str!r}")
    return seq


class BasicResBlock(nn.Module):
    """2-D residual block of the FCM head; `stride` acts on the frequency axis only."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1, **fk: Any) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=(stride, 1), padding=1, bias=False, **fk)
        self.bn1 = nn.BatchNorm2d(planes, eps=BN_EPS, **fk)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False, **fk)
        self.bn2 = nn.BatchNorm2d(planes, eps=BN_EPS, **fk)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=(stride, 1), bias=False, **fk),
                nn.BatchNorm2d(planes, eps=BN_EPS, **fk),
            )

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """`mask` [B, 1, 1, T]: zero padded frames before each 3x3 conv (the 1x1 shortcut is per frame)."""
        out = F.relu(self.bn1(self.conv1(masked(x, mask))))
        out = self.bn2(self.conv2(masked(out, mask)))
        return F.relu(out + self.shortcut(x))


class FCM(nn.Module):
    """Front-end convolution module: [B, F, T] -> [B, m_channels * F/8, T] (channel index = c * F/8 + f)."""

    def __init__(self, num_blocks: tuple[int, int] = (2, 2), m_channels: int = 32, feat_dim: int = 80, **fk: Any):
        super().__init__()
        if feat_dim % 8:
            raise ValueError(f"CAM++ needs feat_dim divisible by 8 (three stride-2 stages), got {feat_dim}")
        self.in_planes = m_channels
        self.conv1 = nn.Conv2d(1, m_channels, 3, stride=1, padding=1, bias=False, **fk)
        self.bn1 = nn.BatchNorm2d(m_channels, eps=BN_EPS, **fk)
        self.layer1 = self._make_layer(m_channels, num_blocks[0], 2, fk)
        self.layer2 = self._make_layer(m_channels, num_blocks[1], 2, fk)
        self.conv2 = nn.Conv2d(m_channels, m_channels, 3, stride=(2, 1), padding=1, bias=False, **fk)
        self.bn2 = nn.BatchNorm2d(m_channels, eps=BN_EPS, **fk)
        self.out_channels = m_channels * (feat_dim // 8)

    def _make_layer(self, planes: int, num_blocks: int, stride: int, fk: dict[str, Any]) -> nn.Sequential:
        layers = []
        for s in [stride] + [1] * (num_blocks - 1):
            layers.append(BasicResBlock(self.in_planes, planes, s, **fk))
            self.in_planes = planes * BasicResBlock.expansion
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """[B, F, T] -> [B, C * F/8, T]; `mask` [B, 1, 1, T] marks valid frames of a padded call."""
        x = masked(x.unsqueeze(1), mask)
        out = F.relu(self.bn1(self.conv1(x)))
        for block in (*self.layer1, *self.layer2):
            out = block(out, mask)
        out = F.relu(self.bn2(self.conv2(masked(out, mask))))
        shape = out.shape
        return out.reshape(shape[0], shape[1] * shape[2], shape[3])


class TDNNLayer(nn.Module):
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding: int = -1,
        dilation: int = 1,
        bias: bool = False,
        config_str: str = "batchnorm-relu",
        **fk: Any,
    ) -> None:
        super().__init__()
        if padding < 0:
            if kernel_size % 2 != 1:
                raise ValueError(f"TDNNLayer with implicit padding needs an odd kernel size, got {kernel_size}")
            padding = (kernel_size - 1) // 2 * dilation
        self.linear = nn.Conv1d(in_channels, out_channels, kernel_size, stride, padding, dilation, bias=bias, **fk)
        self.nonlinear = get_nonlinear(config_str, out_channels, **fk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.nonlinear(self.linear(x))


class CAMLayer(nn.Module):
    """Context-aware masking: local conv gated by sigmoid(MLP(utterance mean + 100-frame segment mean))."""

    def __init__(
        self,
        bn_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int,
        padding: int,
        dilation: int,
        bias: bool,
        reduction: int = 2,
        **fk: Any,
    ) -> None:
        super().__init__()
        self.linear_local = nn.Conv1d(
            bn_channels, out_channels, kernel_size, stride, padding, dilation, bias=bias, **fk
        )
        self.linear1 = nn.Conv1d(bn_channels, bn_channels // reduction, 1, **fk)
        self.relu = nn.ReLU(inplace=True)
        self.linear2 = nn.Conv1d(bn_channels // reduction, out_channels, 1, **fk)
        self.sigmoid = nn.Sigmoid()
        # "legacy" | "exact" (already resolved); set by CAMPPlus.set_seg_pool_mode.
        self.seg_pool_mode = "exact"

    def forward(self, x: torch.Tensor, frames: FrameInfo | None = None) -> torch.Tensor:
        if frames is None:
            y = self.linear_local(x)
            context = x.mean(-1, keepdim=True) + seg_pool(x, self.seg_pool_mode)  # type: ignore[arg-type]
        else:  # padded call: the local conv and the context see zeros on padded frames
            x = masked(x, frames.pooled_mask)
            y = self.linear_local(x)
            context = frames_of_segments(cam_context(x, frames, dim=2), 2, x.shape[-1])
        context = self.relu(self.linear1(context))
        m = self.sigmoid(self.linear2(context))
        return y * m


class CAMDenseTDNNLayer(nn.Module):
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        bn_channels: int,
        kernel_size: int,
        stride: int = 1,
        dilation: int = 1,
        bias: bool = False,
        config_str: str = "batchnorm-relu",
        **fk: Any,
    ) -> None:
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f"CAMDenseTDNNLayer needs an odd kernel size, got {kernel_size}")
        padding = (kernel_size - 1) // 2 * dilation
        self.nonlinear1 = get_nonlinear(config_str, in_channels, **fk)
        self.linear1 = nn.Conv1d(in_channels, bn_channels, 1, bias=False, **fk)
        self.nonlinear2 = get_nonlinear(config_str, bn_channels, **fk)
        self.cam_layer = CAMLayer(
            bn_channels, out_channels, kernel_size, stride=stride, padding=padding, dilation=dilation, bias=bias, **fk
        )

    def forward(self, x: torch.Tensor, frames: FrameInfo | None = None) -> torch.Tensor:
        x = self.linear1(self.nonlinear1(x))
        return self.cam_layer(self.nonlinear2(x), frames)


class CAMDenseTDNNBlock(nn.ModuleList):
    """Densely connected stack: layer i sees the concatenation of the block input and all earlier outputs."""

    def __init__(
        self,
        num_layers: int,
        in_channels: int,
        out_channels: int,
        bn_channels: int,
        kernel_size: int,
        stride: int = 1,
        dilation: int = 1,
        bias: bool = False,
        config_str: str = "batchnorm-relu",
        **fk: Any,
    ) -> None:
        super().__init__()
        for i in range(num_layers):
            layer = CAMDenseTDNNLayer(
                in_channels + i * out_channels,
                out_channels,
                bn_channels,
                kernel_size,
                stride=stride,
                dilation=dilation,
                bias=bias,
                config_str=config_str,
                **fk,
            )
            # 1-based names: "tdnnd1" ... are the upstream state_dict keys.
            self.add_module(f"tdnnd{i + 1}", layer)

    def forward(self, x: torch.Tensor, frames: FrameInfo | None = None) -> torch.Tensor:
        for layer in self:
            x = torch.cat([x, layer(x, frames)], dim=1)
        return x


class TransitLayer(nn.Module):
    def __init__(
        self, in_channels: int, out_channels: int, bias: bool = True, config_str: str = "batchnorm-relu", **fk: Any
    ) -> None:
        super().__init__()
        self.nonlinear = get_nonlinear(config_str, in_channels, **fk)
        self.linear = nn.Conv1d(in_channels, out_channels, 1, bias=bias, **fk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.nonlinear(x))


class DenseLayer(nn.Module):
    def __init__(
        self, in_channels: int, out_channels: int, bias: bool = False, config_str: str = "batchnorm-relu", **fk: Any
    ) -> None:
        super().__init__()
        self.linear = nn.Conv1d(in_channels, out_channels, 1, bias=bias, **fk)
        self.nonlinear = get_nonlinear(config_str, out_channels, **fk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = self.linear(x.unsqueeze(dim=-1)).squeeze(dim=-1)
        else:
            x = self.linear(x)
        return self.nonlinear(x)


class StatsPool(nn.Module):
    """concat(mean_T, std_T) with the unbiased std and no epsilon (needs T' >= 2)."""

    def forward(self, x: torch.Tensor, frames: FrameInfo | None = None) -> torch.Tensor:
        if frames is not None:  # padded call: pool over the valid frames only
            return statistics(x, frames, frames.pooled_mask, dim=2)
        mean = x.mean(dim=-1)
        std = x.std(dim=-1, unbiased=True)
        return torch.cat([mean, std], dim=-1)
