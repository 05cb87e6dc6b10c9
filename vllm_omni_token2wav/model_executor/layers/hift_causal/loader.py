# SPDX-License-Identifier: Apache-2.0
"""Load Fun-CosyVoice3's (or MiniCPM-o's causal) `hift.pt` into `CausalHiFTGenerator`, strictly.

The file format, both weight-norm spellings, the optional `generator.` prefix and the strict key
check are the shared HiFT loader's (`cosyvoice2.hift.loader`); this adds what only the causal
vocoder has: the noise table it draws from (not in the file: see `noise.py` for which loader draws
which table) and where its float64 F0 predictor runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from vllm_omni_token2wav.model_executor.layers.hift.loader import (
    CAUSAL_HIFT_CONV_PRE_KERNEL,
    build_loaded,
    read_hift_checkpoint,
)
from vllm_omni_token2wav.model_executor.layers.hift_causal.config import FULL_CAUSAL_HIFT_CONFIG, CausalHiFTConfig
from vllm_omni_token2wav.model_executor.layers.hift_causal.generator import CausalHiFTGenerator
from vllm_omni_token2wav.model_executor.layers.hift_causal.noise import GeneratedNoiseTable, NoiseOrigin, NoiseTable
from vllm_omni_token2wav.platforms import DeviceSpec

NoiseSpec = NoiseTable | NoiseOrigin | Callable[[CausalHiFTConfig], NoiseOrigin] | None


def _noise_table(config: CausalHiFTConfig, noise: NoiseSpec) -> NoiseTable:
    if callable(noise):  # a preset such as NoiseOrigin.vocoder_yaml, given the file's config
        noise = noise(config)
    if noise is None or isinstance(noise, NoiseOrigin):
        return GeneratedNoiseTable.for_config(config, noise)
    if noise.harmonics != config.nb_harmonics + 1:
        raise ValueError(
            f"noise table has {noise.harmonics} harmonics, the vocoder makes {config.nb_harmonics + 1} "
            f"({noise.identity})"
        )
    return noise


def load_causal_hift(
    path: str | os.PathLike[str],
    *,
    device: DeviceSpec = None,
    fold_weight_norm: bool = True,
    dtype: torch.dtype = torch.float32,
    noise: NoiseSpec = None,
) -> CausalHiFTGenerator:
    """Build the causal HiFT from `hift.pt` (either weight-norm scheme, optional `generator.` prefix).

    `noise`: the table the reference would draw: a `NoiseOrigin`, a preset taking the file's config
    (`NoiseOrigin.cosyvoice3`, the default: what CosyVoice's CosyVoice3 loader draws;
    `NoiseOrigin.vocoder_yaml`: a vocoder-only config), or any `NoiseTable`.

    Returns the model in eval mode on `device` (default: the serving platform's device), decoder
    in `dtype`, F0 predictor in float64: on the CPU when serving on an NPU (no float64
    convolutions there), else next to the decoder.
    """
    path, state_dict, config = read_hift_checkpoint(
        path, base=FULL_CAUSAL_HIFT_CONFIG, conv_pre_kernel=CAUSAL_HIFT_CONV_PRE_KERNEL
    )
    if not isinstance(config, CausalHiFTConfig):  # read_hift_checkpoint returns `base`'s type
        raise TypeError(f"expected a CausalHiFTConfig, got {type(config).__name__}")
    table = _noise_table(config, noise)
    model = build_loaded(
        path,
        state_dict,
        lambda: CausalHiFTGenerator(config, dtype=dtype, noise=table),
        device=device,
        fold_weight_norm=fold_weight_norm,
    )
    from vllm_omni_token2wav import platforms

    if platforms.current_omni_platform.is_npu() and model.device.type != "cpu":
        model.place_f0_predictor("cpu")
    return model
