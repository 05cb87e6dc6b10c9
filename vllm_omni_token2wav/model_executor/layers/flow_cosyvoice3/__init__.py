# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3's flow `CausalMaskedDiffWithDiT` (Fun-CosyVoice3 `flow.pt`): speech tokens + prompt -> 50 Hz mel.

Whole utterance (`CausalMaskedDiffWithDiT.inference`, full or block-causal attention) and streaming at
constant cost per chunk (`start_stream` / `stream_chunk`: per-request caches instead of upstream's
prefix re-runs; `stream_chunks`: the chunks of several streams in one launch). Entry points:
`load_flow` (real or stand-in files), `ensure_standin_flow` (deterministic stand-ins), `stream_calls`
(upstream's chunk schedule).
Design notes: docs/design/cosyvoice3.md.
"""

from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.config import (
    REAL_FLOW_CONFIG,
    REDUCED_FLOW_CONFIG,
    CosyVoice3FlowConfig,
    flow_config_from_yaml,
    render_cosyvoice3_yaml,
)
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.flow import CausalMaskedDiffWithDiT, align_prompt
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.loader import (
    ensure_standin_flow,
    load_flow,
    standin_flow_dir,
    write_standin_flow,
)
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.noise import NOISE_FRAMES, noise_table
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.schedule import (
    ScheduledCall,
    stream_calls,
    upstream_hops,
)
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.state import (
    DEFAULT_FINAL_CHUNK,
    ChunkPlan,
    FinalChunk,
    FlowStreamState,
)
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.streaming import (
    plan_chunk,
    start_stream,
    stream_chunk,
    stream_chunks,
)

__all__ = [
    "DEFAULT_FINAL_CHUNK",
    "NOISE_FRAMES",
    "REAL_FLOW_CONFIG",
    "REDUCED_FLOW_CONFIG",
    "CausalMaskedDiffWithDiT",
    "ChunkPlan",
    "CosyVoice3FlowConfig",
    "FinalChunk",
    "FlowStreamState",
    "ScheduledCall",
    "align_prompt",
    "ensure_standin_flow",
    "flow_config_from_yaml",
    "load_flow",
    "noise_table",
    "plan_chunk",
    "render_cosyvoice3_yaml",
    "standin_flow_dir",
    "start_stream",
    "stream_calls",
    "stream_chunk",
    "stream_chunks",
    "upstream_hops",
    "write_standin_flow",
]
