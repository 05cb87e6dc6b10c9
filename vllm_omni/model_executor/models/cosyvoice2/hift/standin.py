# SPDX-License-Identifier: Apache-2.0
"""Deterministic stand-in `hift.pt` files, laid out like the shipped one.

The real vocoder weights cannot be downloaded in CI, so loaders and the end-to-end stage are
tested on files with the real key set, shapes (full size) or topology (reduced), and either
weight-norm spelling. Weights are random but scaled so the stand-in behaves like a vocoder
numerically: per-channel weight norms near 1 (activations stay O(1) through the 3 stages), F0 of
a few hundred Hz with both voiced and unvoiced frames, log-magnitudes well below the exp clip.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch

from vllm_omni import envs
from vllm_omni.atomic_io import atomic_output
from vllm_omni.logger import init_logger
from vllm_omni.model_executor.models.cosyvoice2.hift.config import FULL_HIFT_CONFIG, REDUCED_HIFT_CONFIG
from vllm_omni.model_executor.models.cosyvoice2.hift.generator import HiFTGenerator
from vllm_omni.model_executor.models.cosyvoice2.hift.loader import PREFIX, expected_hift_shapes

logger = init_logger(__name__)

KeyScheme = Literal["new", "old"]
# Bump when the stand-in recipe changes so cached files are regenerated.
STANDIN_VERSION = 1
# Process-wide: tests and benchmarks in one process ask for the same cached file from several
# fixtures/threads; the lock makes the generate-then-rename happen once.
_cache_lock = threading.Lock()


def standin_state_dict(
    shapes: dict[str, tuple[int, ...]], *, seed: int, key_scheme: KeyScheme = "new"
) -> dict[str, torch.Tensor]:
    """Stand-in tensors for a HiFT-layout key set `shapes` (new weight-norm spelling), in `key_scheme`.

    The recipe only looks at key suffixes, so it serves both vocoders (HiFT and the causal HiFT).
    """
    if key_scheme not in ("new", "old"):
        raise ValueError(f"key_scheme must be 'new' or 'old', got {key_scheme!r}")
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for key in sorted(shapes):
        shape = shapes[key]
        if key.endswith("original0"):  # weight-norm g: the per-output-channel norm of the weight
            gain = 0.1 if key.startswith("conv_post") else 1.0
            value = gain * (1.0 + 0.1 * torch.randn(shape, generator=gen))
        elif key.endswith("original1") or key.endswith(".weight"):
            value = torch.randn(shape, generator=gen)
            if key.endswith(".weight") and len(shape) >= 2:
                fan_in = shape[1] * (shape[2] if len(shape) > 2 else 1)
                value = value / fan_in**0.5
        elif key.endswith(".alpha"):
            value = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif key.endswith(".bias"):
            value = 0.01 * torch.randn(shape, generator=gen)
        else:
            raise AssertionError(f"stand-in recipe has no rule for {key}")  # internal invariant
        out[key] = value.to(torch.float32)
    # F0 ~ |N(0, 150 Hz)|: a mix of voiced (> 10 Hz) and unvoiced frames exercises both source branches.
    cls = out["f0_predictor.classifier.weight"]
    out["f0_predictor.classifier.weight"] = cls / cls.norm() * 150.0
    out["f0_predictor.classifier.bias"] = torch.zeros_like(out["f0_predictor.classifier.bias"])
    # Log-magnitude head around exp(-3): audible but far from the 100 clip.
    out["conv_post.bias"] = torch.cat([torch.full((9,), -3.0), torch.zeros(9)])
    if key_scheme == "old":
        out = {
            k.replace(".parametrizations.weight.original0", ".weight_g").replace(
                ".parametrizations.weight.original1", ".weight_v"
            ): v
            for k, v in out.items()
        }
    return out


def standin_hift_state_dict(*, reduced: bool, seed: int, key_scheme: KeyScheme = "new") -> dict[str, torch.Tensor]:
    """The stand-in tensors, keyed like hift.pt in `key_scheme` (no prefix)."""
    config = REDUCED_HIFT_CONFIG if reduced else FULL_HIFT_CONFIG
    with torch.device("meta"):
        shapes = expected_hift_shapes(HiFTGenerator(config))
    return standin_state_dict(shapes, seed=seed, key_scheme=key_scheme)


def save_standin(path: str | os.PathLike[str], state_dict: dict[str, torch.Tensor], *, prefix: bool, what: str) -> Path:
    """Write `state_dict` (optionally with every key under `generator.`) to `path` atomically."""
    if prefix:
        state_dict = {PREFIX + k: v for k, v in state_dict.items()}
    path = Path(path)
    with atomic_output(path) as tmp:
        torch.save(state_dict, tmp)
    logger.info("wrote stand-in %s to %s", what, path)
    return path


def write_standin_hift(
    path: str | os.PathLike[str],
    *,
    reduced: bool,
    seed: int,
    key_scheme: KeyScheme = "new",
    prefix: bool = False,
) -> Path:
    """Write a deterministic stand-in hift.pt to `path` (atomically) and return the path."""
    state_dict = standin_hift_state_dict(reduced=reduced, seed=seed, key_scheme=key_scheme)
    what = (
        f"hift.pt ({'reduced' if reduced else 'full size'}, seed {seed}, {key_scheme} keys"
        f"{', generator. prefix' if prefix else ''})"
    )
    return save_standin(path, state_dict, prefix=prefix, what=what)


def cached_standin(folder: str, name: str, write: Callable[[Path], object]) -> Path:
    """`vllm_omni.envs.cache_dir("standins", folder) / name`, written by `write(path)` on first use."""
    path = envs.cache_dir("standins", folder) / name
    with _cache_lock:
        if not path.is_file():
            write(path)
    return path


def cached_standin_hift(*, reduced: bool, seed: int = 0, key_scheme: KeyScheme = "new", prefix: bool = False) -> Path:
    """A stand-in hift.pt under `vllm_omni.envs.cache_dir("standins", "hift")`, generated on first use."""
    size = "reduced" if reduced else "full"
    name = f"hift_v{STANDIN_VERSION}_{size}_s{seed}_{key_scheme}{'_prefix' if prefix else ''}.pt"
    return cached_standin(
        "hift",
        name,
        lambda path: write_standin_hift(path, reduced=reduced, seed=seed, key_scheme=key_scheme, prefix=prefix),
    )
