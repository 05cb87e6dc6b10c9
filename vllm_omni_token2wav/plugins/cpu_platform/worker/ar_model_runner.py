# SPDX-License-Identifier: Apache-2.0
"""vLLM-Omni's autoregressive (talker / producer) model runner on vLLM's CPU model runner.

Same combination as `generation_model_runner.py`: vLLM-Omni's AR step logic (sampling, multimodal
outputs, the async-chunk hand-off to the next stage) over `CPUModelRunner`'s CPU buffers and CPU
attention backend.
"""

from __future__ import annotations

from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm_omni.worker.gpu_ar_model_runner import GPUARModelRunner


class CPUARModelRunner(GPUARModelRunner, CPUModelRunner):
    """AR-stage runner on CPU (see the module docstring)."""


__all__ = ["CPUARModelRunner"]
