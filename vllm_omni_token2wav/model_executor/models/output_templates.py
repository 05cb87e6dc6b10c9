# SPDX-License-Identifier: Apache-2.0
"""What a stage model's `forward` returns to the vLLM-Omni runner: `OmniOutput`, upstream's class when it runs us.

vLLM-Omni 0.30's runner reads `text_hidden_states` and, for models with
`have_multimodal_outputs = True`, `multimodal_outputs` (a dict of per-request lists) from the
model's result, but only after `isinstance(out, vllm_omni.model_executor.models.output_templates.OmniOutput)`.
Any other class, even a NamedTuple of the same four fields, falls into the runner's tuple branch,
which keeps `out[0]` and sets `multimodal_outputs = {}`: every segment's audio is dropped without an
error (seen with the real engine). So the output class is chosen at call time by `omni_output_class()`:

| situation                                  | class                                                     |
|--------------------------------------------|-----------------------------------------------------------|
| `vllm_omni` is imported (the engine runs   | upstream's `OmniOutput` (imported lazily, here only)      |
| us, or anything in the process imported it)|                                                           |
| otherwise (core install, tools, tests)     | this module's `OmniOutput`: the same four fields, defined |
|                                            | without importing vLLM, so the core works without it      |

Both are NamedTuples of `(text_hidden_states, multimodal_outputs, intermediate_tensors,
next_token_id)`; code reading the result by field works with either.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import torch


class OmniOutput(NamedTuple):
    """Output of a stage model: hidden states for text (None for audio stages) and multimodal payloads."""

    text_hidden_states: torch.Tensor | None
    multimodal_outputs: dict[str, Any] | None = None
    intermediate_tensors: Any = None
    next_token_id: torch.Tensor | None = None


def omni_output_class() -> type:
    """The `OmniOutput` class to return (see the module table): upstream's once `vllm_omni` is imported."""
    if "vllm_omni" not in sys.modules:
        return OmniOutput
    from vllm_omni.model_executor.models.output_templates import OmniOutput as UpstreamOmniOutput

    return UpstreamOmniOutput


__all__ = ["OmniOutput", "omni_output_class"]
