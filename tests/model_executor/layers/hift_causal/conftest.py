# SPDX-License-Identifier: Apache-2.0
"""Reduced causal-HiFT stand-ins for the vocoder tests, written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vllm_omni_token2wav.model_executor.layers.hift_causal import (
    CausalHiFTGenerator,
    NoiseOrigin,
    load_causal_hift,
    standin_mel,
    write_standin_causal_hift,
)

STANDIN_SEED = 3
# An explicit origin keeps the vocoder tests independent of the loader presets (tested in test_noise.py).
NOISE = NoiseOrigin(seed=5, draws_before=0)


@pytest.fixture(scope="session")
def reduced_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_standin_causal_hift(
        tmp_path_factory.mktemp("causal_hift") / "hift.pt", reduced=True, seed=STANDIN_SEED
    )


@pytest.fixture(scope="session")
def model(reduced_path: Path) -> CausalHiFTGenerator:
    """Shared read-only reduced model on the CPU, noise from `NOISE`."""
    return load_causal_hift(reduced_path, device="cpu", noise=NOISE)


def flow_like_mel(frames: int, seed: int, batch: int = 1) -> torch.Tensor:
    """A log-mel shaped like the flow's output (the shared stand-in input)."""
    return standin_mel(frames, seed=seed, batch=batch)
