# SPDX-License-Identifier: Apache-2.0
"""vLLM-Omni's generation (code2wav) model runner on vLLM's CPU model runner.

Method resolution: `CPUGenerationModelRunner -> GPUGenerationModelRunner -> OmniGPUModelRunner ->
... -> CPUModelRunner -> GPUModelRunner`, so vLLM-Omni's step logic (one `forward` per step over
every scheduled request, `seq_token_counts`, `request_ids`, multimodal outputs per request) runs
on CPU buffers: `CPUModelRunner.__init__` builds the GPU runner state with CUDA streams and events
replaced by no-ops and then points every device buffer at its CPU twin.
"""

from __future__ import annotations

from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm_omni.worker.gpu_generation_model_runner import GPUGenerationModelRunner


class CPUGenerationModelRunner(GPUGenerationModelRunner, CPUModelRunner):
    """Generation-stage runner on CPU (see the module docstring)."""


__all__ = ["CPUGenerationModelRunner"]
