# SPDX-License-Identifier: Apache-2.0
"""What a stage model's `forward` returns to the vLLM-Omni runner: `OmniOutput`.

vLLM-Omni 0.30's runner reads `text_hidden_states` and, for models with
`have_multimodal_outputs = True`, `multimodal_outputs` (a dict of per-request lists) from the
model's result; its `OmniOutput` (`vllm_omni/model_executor/models/output_templates.py`) is a
NamedTuple of these four fields. This is the same shape, defined here without importing vLLM, so
stage models build it on hosts without vLLM and the runner can read it field by field (or turn a
plain tuple of the four fields back into its own type, as upstream's `make_omni_output` does).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch


class OmniOutput(NamedTuple):
    """Output of a stage model: hidden states for text (None for audio stages) and multimodal payloads."""

    text_hidden_states: torch.Tensor | None
    multimodal_outputs: dict[str, Any] | None = None
    intermediate_tensors: Any = None
    next_token_id: torch.Tensor | None = None


__all__ = ["OmniOutput"]
