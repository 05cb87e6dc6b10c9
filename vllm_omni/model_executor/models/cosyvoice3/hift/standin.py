# SPDX-License-Identifier: Apache-2.0
"""Deterministic stand-in causal `hift.pt` files (Fun-CosyVoice3 layout), reduced or full size.

Same recipe as the HiFT stand-ins (`cosyvoice2.hift.standin`: weight norms near 1, F0 of a few
hundred Hz with voiced and unvoiced frames, log-magnitudes near exp(-3)) on the causal vocoder's
key set: 328 keys, 20,779,887 parameters at full size, either weight-norm spelling, optionally
under `generator.`.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from vllm_omni.model_executor.models.cosyvoice2.hift.loader import expected_hift_shapes
from vllm_omni.model_executor.models.cosyvoice2.hift.standin import (
    STANDIN_VERSION,
    KeyScheme,
    cached_standin,
    save_standin,
    standin_state_dict,
)
from vllm_omni.model_executor.models.cosyvoice3.hift.config import FULL_CAUSAL_HIFT_CONFIG, REDUCED_CAUSAL_HIFT_CONFIG
from vllm_omni.model_executor.models.cosyvoice3.hift.generator import CausalHiFTGenerator


def causal_hift_shapes(*, reduced: bool) -> dict[str, tuple[int, ...]]:
    """Key -> shape of a causal hift.pt (new weight-norm spelling), computed on the meta device."""
    config = REDUCED_CAUSAL_HIFT_CONFIG if reduced else FULL_CAUSAL_HIFT_CONFIG
    with torch.device("meta"):
        return expected_hift_shapes(CausalHiFTGenerator(config))


def standin_causal_hift_state_dict(
    *, reduced: bool, seed: int, key_scheme: KeyScheme = "new"
) -> dict[str, torch.Tensor]:
    """The stand-in tensors, keyed like the causal hift.pt in `key_scheme` (no prefix)."""
    return standin_state_dict(causal_hift_shapes(reduced=reduced), seed=seed, key_scheme=key_scheme)


def write_standin_causal_hift(
    path: str | os.PathLike[str],
    *,
    reduced: bool,
    seed: int,
    key_scheme: KeyScheme = "new",
    prefix: bool = False,
) -> Path:
    """Write a deterministic stand-in causal hift.pt to `path` (atomically) and return the path."""
    state_dict = standin_causal_hift_state_dict(reduced=reduced, seed=seed, key_scheme=key_scheme)
    what = (
        f"causal hift.pt ({'reduced' if reduced else 'full size'}, seed {seed}, {key_scheme} keys"
        f"{', generator. prefix' if prefix else ''})"
    )
    return save_standin(path, state_dict, prefix=prefix, what=what)


def cached_standin_causal_hift(
    *, reduced: bool, seed: int = 0, key_scheme: KeyScheme = "new", prefix: bool = False
) -> Path:
    """A stand-in causal hift.pt under `vllm_omni.envs.cache_dir("standins", "causal_hift")`, made on first use."""
    size = "reduced" if reduced else "full"
    name = f"causal_hift_v{STANDIN_VERSION}_{size}_s{seed}_{key_scheme}{'_prefix' if prefix else ''}.pt"
    return cached_standin(
        "causal_hift",
        name,
        lambda path: write_standin_causal_hift(path, reduced=reduced, seed=seed, key_scheme=key_scheme, prefix=prefix),
    )


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
