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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from vllm_omni_token2wav import envs
from vllm_omni_token2wav.atomic_io import atomic_output
from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.layers.hift.config import (
    FULL_HIFT_CONFIG,
    REDUCED_HIFT_CONFIG,
    HiFTConfig,
)
from vllm_omni_token2wav.model_executor.layers.hift.generator import HiFTGenerator
from vllm_omni_token2wav.model_executor.layers.hift.layers import HiFTBase
from vllm_omni_token2wav.model_executor.layers.hift.loader import PREFIX, expected_hift_shapes

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


@dataclass(frozen=True)
class StandinFamily:
    """One kind of stand-in vocoder file: its key layout, its name in logs, where cached copies live.

    The methods make the tensors for the full or reduced config, write them and keep cached
    copies, the same way for every family (HiFT here, CosyVoice3's causal HiFT in
    `cosyvoice3.hift.standin`).
    """

    name: str  # in log lines: "hift.pt"
    stem: str  # cache file names: <stem>_v<version>_<size>_s<seed>_<scheme>[_prefix].pt
    build: Callable[[Any], HiFTBase]  # config -> model (built on the meta device for the shapes)
    full: HiFTConfig
    reduced: HiFTConfig

    def shapes(self, reduced: bool) -> dict[str, tuple[int, ...]]:
        """Key -> shape of the file (new weight-norm spelling), from a model on the meta device."""
        with torch.device("meta"):
            return expected_hift_shapes(self.build(self.reduced if reduced else self.full))

    def state_dict(self, *, reduced: bool, seed: int, key_scheme: KeyScheme = "new") -> dict[str, torch.Tensor]:
        """The stand-in tensors, keyed like the shipped file in `key_scheme` (no prefix)."""
        return standin_state_dict(self.shapes(reduced), seed=seed, key_scheme=key_scheme)

    def write(
        self,
        path: str | os.PathLike[str],
        *,
        reduced: bool,
        seed: int,
        key_scheme: KeyScheme = "new",
        prefix: bool = False,
    ) -> Path:
        """Write a deterministic stand-in to `path` (atomically; keys under `generator.` with `prefix`)."""
        state_dict = self.state_dict(reduced=reduced, seed=seed, key_scheme=key_scheme)
        if prefix:
            state_dict = {PREFIX + k: v for k, v in state_dict.items()}
        path = Path(path)
        with atomic_output(path) as tmp:
            torch.save(state_dict, tmp)
        logger.info(
            "wrote stand-in %s (%s, seed %d, %s keys%s) to %s",
            self.name,
            "reduced" if reduced else "full size",
            seed,
            key_scheme,
            ", generator. prefix" if prefix else "",
            path,
        )
        return path

    def cached(self, *, reduced: bool, seed: int = 0, key_scheme: KeyScheme = "new", prefix: bool = False) -> Path:
        """A stand-in under `vllm_omni_token2wav.envs.cache_dir("standins", stem)`, generated on first use."""
        size = "reduced" if reduced else "full"
        name = f"{self.stem}_v{STANDIN_VERSION}_{size}_s{seed}_{key_scheme}{'_prefix' if prefix else ''}.pt"
        path = envs.cache_dir("standins", self.stem) / name
        with _cache_lock:
            if not path.is_file():
                self.write(path, reduced=reduced, seed=seed, key_scheme=key_scheme, prefix=prefix)
        return path


HIFT_STANDINS = StandinFamily("hift.pt", "hift", HiFTGenerator, FULL_HIFT_CONFIG, REDUCED_HIFT_CONFIG)
# The module's long-standing entry points.
standin_hift_state_dict = HIFT_STANDINS.state_dict
write_standin_hift = HIFT_STANDINS.write
cached_standin_hift = HIFT_STANDINS.cached
