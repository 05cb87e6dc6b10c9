# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3's causal HiFT vocoder, whole-utterance and streamed at constant cost per chunk.

`load_causal_hift(path)` reads Fun-CosyVoice3's (or MiniCPM-o's causal) `hift.pt` strictly;
`CausalHiFTGenerator.inference(mel, finalize)` vocodes like the reference; `CausalHiFTStreamer`
(`start()` / `push(state, mel, finalize=...)`) streams with a frozen per-request state under a
`StreamPolicy` (`COSYVOICE3_STREAM`, `MINICPMO_1_0_7_STREAM`); `write_standin_causal_hift` makes
deterministic stand-ins. Design notes: docs/design/causal_hift.md.
"""

from vllm_omni_token2wav.model_executor.layers.hift_causal.config import (
    FULL_CAUSAL_HIFT_CONFIG,
    FULL_CAUSAL_HIFT_NUM_KEYS,
    FULL_CAUSAL_HIFT_NUM_PARAMS,
    REDUCED_CAUSAL_HIFT_CONFIG,
    CausalHiFTConfig,
)
from vllm_omni_token2wav.model_executor.layers.hift_causal.generator import CausalHiFTGenerator
from vllm_omni_token2wav.model_executor.layers.hift_causal.loader import load_causal_hift
from vllm_omni_token2wav.model_executor.layers.hift_causal.noise import (
    GeneratedNoiseTable,
    NoiseCursor,
    NoiseOrigin,
    NoiseTable,
    TensorNoiseTable,
)
from vllm_omni_token2wav.model_executor.layers.hift_causal.source import PhaseMode
from vllm_omni_token2wav.model_executor.layers.hift_causal.standin import (
    cached_standin_causal_hift,
    standin_causal_hift_state_dict,
    standin_mel,
    write_standin_causal_hift,
)
from vllm_omni_token2wav.model_executor.layers.hift_causal.stream import (
    COSYVOICE3_STREAM,
    MINICPMO_1_0_7_STREAM,
    CausalHiFTStreamer,
    CausalHiFTStreamState,
    StreamPolicy,
)

__all__ = [
    "COSYVOICE3_STREAM",
    "FULL_CAUSAL_HIFT_CONFIG",
    "FULL_CAUSAL_HIFT_NUM_KEYS",
    "FULL_CAUSAL_HIFT_NUM_PARAMS",
    "MINICPMO_1_0_7_STREAM",
    "REDUCED_CAUSAL_HIFT_CONFIG",
    "CausalHiFTConfig",
    "CausalHiFTGenerator",
    "CausalHiFTStreamState",
    "CausalHiFTStreamer",
    "GeneratedNoiseTable",
    "NoiseCursor",
    "NoiseOrigin",
    "NoiseTable",
    "PhaseMode",
    "StreamPolicy",
    "TensorNoiseTable",
    "cached_standin_causal_hift",
    "load_causal_hift",
    "standin_causal_hift_state_dict",
    "standin_mel",
    "write_standin_causal_hift",
]
