# SPDX-License-Identifier: Apache-2.0
"""Deterministic stand-in `speech_tokenizer_v2_25hz.onnx` files, exported from the in-tree model.

The real tokenizer cannot be downloaded in CI. The stand-in has the shipped layout (see
`onnx_export`) and random weights from a seeded generator, scaled so the network behaves like a
tokenizer numerically: unit-gain projections, LayerNorm gains near 1, and an FSQ projection whose
pre-tanh values spread over several rounding cells, so real speech maps to many distinct codes
(a tokenizer that emits one code everywhere would make the parity tests vacuous).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import torch

from vllm_omni_token2wav import envs
from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.config import (
    FULL_TOKENIZER_CONFIG,
    REDUCED_TOKENIZER_CONFIG,
)
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.model import SpeechTokenizerV2
from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.onnx_export import (
    export_speech_tokenizer_onnx,
)

logger = init_logger(__name__)

# Bump when the stand-in recipe changes so cached files are regenerated.
STANDIN_VERSION = 2
FSQ_PRE_TANH_GAIN = 2.0
# Process-wide: several fixtures/threads of one process may ask for the same cached file; the
# lock makes the generate-then-rename happen once.
_cache_lock = threading.Lock()


def standin_speech_tokenizer(*, reduced: bool, seed: int) -> SpeechTokenizerV2:
    """The in-tree model with deterministic stand-in weights (CPU, fp32, eval)."""
    config = REDUCED_TOKENIZER_CONFIG if reduced else FULL_TOKENIZER_CONFIG
    model = SpeechTokenizerV2(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("_ln.weight"):
                value = 1.0 + 0.05 * torch.randn(param.shape, generator=gen)
            elif name.endswith("bias"):
                value = 0.02 * torch.randn(param.shape, generator=gen)
            else:
                fan_in = param[0].numel() if param.dim() > 1 else param.numel()
                value = torch.randn(param.shape, generator=gen) / fan_in**0.5
                if "project_down" in name:
                    value = value * FSQ_PRE_TANH_GAIN
            param.copy_(value)
    return model.eval()


def write_standin_speech_tokenizer(path: str | os.PathLike[str], *, reduced: bool, seed: int) -> Path:
    """Export a deterministic stand-in tokenizer ONNX file to `path` (atomically); returns the path."""
    path = export_speech_tokenizer_onnx(standin_speech_tokenizer(reduced=reduced, seed=seed), path)
    logger.info(
        "wrote stand-in speech tokenizer (%s, seed %d) to %s", "reduced" if reduced else "full size", seed, path
    )
    return path


def cached_standin_speech_tokenizer(*, reduced: bool, seed: int = 0) -> Path:
    """A stand-in under `vllm_omni_token2wav.envs.cache_dir("standins", "speech_tokenizer")`, generated on first use."""
    size = "reduced" if reduced else "full"
    path = (
        envs.cache_dir("standins", "speech_tokenizer") / f"speech_tokenizer_v2_v{STANDIN_VERSION}_{size}_s{seed}.onnx"
    )
    with _cache_lock:
        if not path.is_file():
            write_standin_speech_tokenizer(path, reduced=reduced, seed=seed)
    return path
