# SPDX-License-Identifier: Apache-2.0
"""CAM++ (D-TDNN with context-aware masking), the speaker encoder behind CosyVoice's `campplus.onnx`.

The module tree equals upstream's (`head.*` FCM + `xvector` Sequential of tdnn, block1..3,
transit1..3, out_nonlinear, stats, dense), so `state_dict()` has exactly the upstream 815 tensors
plus 122 `num_batches_tracked` and original PyTorch checkpoints load with `strict=True`.
`block_layers` and `m_channels` are not upstream options; they only exist for the reduced-size
stand-ins the tests export (the defaults are the upstream network).

Seg-pool default: `"exact"`, because that is what upstream's PyTorch code computes, so a model
built here from a PyTorch checkpoint behaves like upstream. The ONNX loader
(`speaker_embedding/campplus/onnx_import.py`, used by `speaker_embedding/torch_backend.py`) defaults to `"legacy"`, the
runtime the file's consumers were trained with; see `campplus.segpool`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import nn

from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.layers import (
    FCM,
    CAMDenseTDNNBlock,
    CAMLayer,
    DenseLayer,
    StatsPool,
    TDNNLayer,
    TransitLayer,
    factory_kwargs,
    get_nonlinear,
)
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.masking import (
    FrameInfo,
    check_lengths,
    masked,
)
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.segpool import resolve_seg_pool_mode

UPSTREAM_BLOCK_LAYERS = (12, 24, 16)
UPSTREAM_DILATIONS = (1, 2, 2)


class CAMPPlus(nn.Module):
    """`[B, T, feat_dim]` fbank features -> `[B, embedding_size]` raw (not L2-normalised) speaker embedding."""

    def __init__(
        self,
        feat_dim: int = 80,
        embedding_size: int = 192,
        growth_rate: int = 32,
        bn_size: int = 4,
        init_channels: int = 128,
        config_str: str = "batchnorm-relu",
        seg_pool_mode: str = "exact",
        *,
        m_channels: int = 32,
        block_layers: tuple[int, ...] = UPSTREAM_BLOCK_LAYERS,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if len(block_layers) != len(UPSTREAM_DILATIONS) or min(block_layers) < 1:
            raise ValueError(f"block_layers must be 3 positive layer counts, got {block_layers!r}")
        fk: dict[str, Any] = factory_kwargs(device, dtype)
        self.feat_dim = feat_dim
        self.embedding_size = embedding_size
        self.config = {
            "feat_dim": feat_dim,
            "embedding_size": embedding_size,
            "growth_rate": growth_rate,
            "bn_size": bn_size,
            "init_channels": init_channels,
            "config_str": config_str,
            "m_channels": m_channels,
            "block_layers": tuple(block_layers),
        }
        self.head = FCM(feat_dim=feat_dim, m_channels=m_channels, **fk)
        channels = self.head.out_channels
        self.xvector = nn.Sequential(
            OrderedDict(
                [("tdnn", TDNNLayer(channels, init_channels, 5, stride=2, dilation=1, config_str=config_str, **fk))]
            )
        )
        channels = init_channels
        for i, (num_layers, dilation) in enumerate(zip(block_layers, UPSTREAM_DILATIONS, strict=True)):
            block = CAMDenseTDNNBlock(
                num_layers,
                channels,
                growth_rate,
                bn_size * growth_rate,
                3,
                dilation=dilation,
                config_str=config_str,
                **fk,
            )
            self.xvector.add_module(f"block{i + 1}", block)
            channels += num_layers * growth_rate
            self.xvector.add_module(
                f"transit{i + 1}", TransitLayer(channels, channels // 2, bias=False, config_str=config_str, **fk)
            )
            channels //= 2
        self.xvector.add_module("out_nonlinear", get_nonlinear(config_str, channels, **fk))
        self.xvector.add_module("stats", StatsPool())
        self.xvector.add_module("dense", DenseLayer(channels * 2, embedding_size, config_str="batchnorm_", **fk))
        self.seg_pool_mode = "exact"
        self.set_seg_pool_mode(seg_pool_mode)

    def set_seg_pool_mode(self, mode: str) -> None:
        """Set how the last partial 100-frame segment is averaged ("legacy" | "exact" | "auto", see segpool)."""
        resolved = resolve_seg_pool_mode(mode)
        self.seg_pool_mode = resolved
        for module in self.modules():
            if isinstance(module, CAMLayer):
                module.seg_pool_mode = resolved

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """`x` [B, T, F] -> [B, E]. With `lengths` [B] (int), frames >= lengths[b] of row b are padding.

        A padded call returns the embeddings of the unpadded rows (up to fp32 rounding: the masked
        poolings sum instead of averaging) with shapes that depend on B and T only and no host
        synchronisation; `campplus.masking` says how. The serving form `CampplusInference` has the
        same contract, bit-exact on CPU.
        """
        x = x.permute(0, 2, 1)  # [B, T, F] -> [B, F, T]
        if lengths is None:
            return self.xvector(self.head(x))
        check_lengths(lengths, x.shape[-1], x.shape[0])
        frames = FrameInfo.padded(lengths.to(x.device), x.shape[-1], self.seg_pool_mode, x.dtype)  # type: ignore[arg-type]
        assert frames.input_mask is not None
        x = self.head(x, frames.input_mask)
        for module in self.xvector:
            if isinstance(module, TDNNLayer):
                x = module(masked(x, frames.input_mask[:, 0]))  # the k5 conv mixes frames
            elif isinstance(module, CAMDenseTDNNBlock | StatsPool):
                x = module(x, frames)
            else:  # transit, out_nonlinear, dense: per frame / per utterance
                x = module(x)
        return x
