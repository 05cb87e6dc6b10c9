# SPDX-License-Identifier: Apache-2.0
"""In-tree flow-matching model of Step-Audio2 / MiniCPM-o 4.5 Token2Wav (`flow.yaml` + `flow.pt`).

Speech tokens (25 Hz) + a prompt (tokens, 50 Hz mel, CAM++ embedding) -> 80-bin mel at 50 Hz, whole
utterance (`CausalMaskedDiffWithXvec.inference`) or streamed (`setup_cache` / `inference_chunk`).
Entry points: `load_flow` (real or stand-in files), `write_standin_flow` (deterministic stand-ins).
Design notes: docs/design/token2wav_synthesis.md, "Flow model".
"""

from vllm_omni_token2wav.model_executor.layers.flow.cfm import CausalConditionalCFM
from vllm_omni_token2wav.model_executor.layers.flow.config import (
    REAL_FLOW_CONFIG,
    REDUCED_FLOW_CONFIG,
    build_flow,
    build_flow_from_yaml,
    render_flow_yaml,
)
from vllm_omni_token2wav.model_executor.layers.flow.dit import DiT
from vllm_omni_token2wav.model_executor.layers.flow.encoder import UpsampleConformerEncoderV2
from vllm_omni_token2wav.model_executor.layers.flow.flow import CausalMaskedDiffWithXvec
from vllm_omni_token2wav.model_executor.layers.flow.loader import (
    ensure_standin_flow,
    load_flow,
    standin_flow_dir,
    standin_state_dict,
    write_standin_flow,
)
from vllm_omni_token2wav.model_executor.layers.flow.streaming import (
    ConformerTrim,
    FlowStreamCache,
    Lookahead,
)

__all__ = [
    "REAL_FLOW_CONFIG",
    "REDUCED_FLOW_CONFIG",
    "CausalConditionalCFM",
    "CausalMaskedDiffWithXvec",
    "ConformerTrim",
    "DiT",
    "FlowStreamCache",
    "Lookahead",
    "UpsampleConformerEncoderV2",
    "build_flow",
    "build_flow_from_yaml",
    "ensure_standin_flow",
    "load_flow",
    "render_flow_yaml",
    "standin_flow_dir",
    "standin_state_dict",
    "write_standin_flow",
]
