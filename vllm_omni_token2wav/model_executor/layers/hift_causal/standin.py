# SPDX-License-Identifier: Apache-2.0
"""Deterministic stand-in causal `hift.pt` files (Fun-CosyVoice3 layout), reduced or full size.

Same recipe as the HiFT stand-ins (`cosyvoice2.hift.standin`: weight norms near 1, F0 of a few
hundred Hz with voiced and unvoiced frames, log-magnitudes near exp(-3)) on the causal vocoder's
key set: 328 keys, 20,779,887 parameters at full size, either weight-norm spelling, optionally
under `generator.`.
"""

from __future__ import annotations

import torch

from vllm_omni_token2wav.model_executor.layers.hift.standin import StandinFamily
from vllm_omni_token2wav.model_executor.layers.hift_causal.config import (
    FULL_CAUSAL_HIFT_CONFIG,
    REDUCED_CAUSAL_HIFT_CONFIG,
)
from vllm_omni_token2wav.model_executor.layers.hift_causal.generator import CausalHiFTGenerator

CAUSAL_HIFT_STANDINS = StandinFamily(
    "causal hift.pt", "causal_hift", CausalHiFTGenerator, FULL_CAUSAL_HIFT_CONFIG, REDUCED_CAUSAL_HIFT_CONFIG
)
standin_causal_hift_state_dict = CAUSAL_HIFT_STANDINS.state_dict
write_standin_causal_hift = CAUSAL_HIFT_STANDINS.write
cached_standin_causal_hift = CAUSAL_HIFT_STANDINS.cached


def standin_mel(frames: int, *, seed: int, batch: int = 1) -> torch.Tensor:
    """A deterministic log-mel [batch, 80, frames] shaped like the flow's output: smooth over time, around -3.

    Input for tests, tools and benchmarks of the vocoder, which never see a real flow here.
    """
    if frames < 0 or batch < 1:
        raise ValueError(f"standin_mel needs frames >= 0 and batch >= 1, got {frames}, {batch}")
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(batch, 80, frames // 4 + 2, generator=g)
    smooth = torch.nn.functional.interpolate(base, size=frames, mode="linear", align_corners=False)
    return smooth * 1.2 - 3.0 + 0.3 * torch.randn(batch, 80, frames, generator=g)
