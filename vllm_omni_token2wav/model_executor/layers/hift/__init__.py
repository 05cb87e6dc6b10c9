# SPDX-License-Identifier: Apache-2.0
"""In-tree HiFT vocoder of the CosyVoice2 token2wav stage (mel -> 24 kHz waveform).

`load_hift(path, device=...)` reads the shipped `hift.pt` strictly; `write_standin_hift(...)` makes
deterministic stand-ins with the same layout for tests and benchmarks.
"""

from vllm_omni_token2wav.model_executor.layers.hift.config import (
    FULL_HIFT_CONFIG,
    FULL_HIFT_NUM_KEYS,
    FULL_HIFT_NUM_PARAMS,
    REDUCED_HIFT_CONFIG,
    HiFTConfig,
)
from vllm_omni_token2wav.model_executor.layers.hift.generator import HiFTGenerator
from vllm_omni_token2wav.model_executor.layers.hift.loader import HiFTLoadError, load_hift
from vllm_omni_token2wav.model_executor.layers.hift.standin import cached_standin_hift, write_standin_hift

__all__ = [
    "FULL_HIFT_CONFIG",
    "FULL_HIFT_NUM_KEYS",
    "FULL_HIFT_NUM_PARAMS",
    "REDUCED_HIFT_CONFIG",
    "HiFTConfig",
    "HiFTGenerator",
    "HiFTLoadError",
    "cached_standin_hift",
    "load_hift",
    "write_standin_hift",
]
