# SPDX-License-Identifier: Apache-2.0
"""Worker of a generation (code2wav) stage on CPU: vLLM's `CPUWorker` + vLLM-Omni's worker mixin.

`OmniWorkerMixin` loads vLLM-Omni's general plugins in the worker process (so our stage classes
are registered before the model is built) and wires vLLM-Omni's connectors; `CPUWorker` binds the
OpenMP threads and sets up the CPU distributed environment. `model_runner_cls` is what vLLM-Omni's
connector validation reads (a runner with the connector mixin), and what `init_device` builds in
place of vLLM's plain `CPUModelRunner`.
"""

from __future__ import annotations

from vllm.v1.worker.cpu_worker import CPUWorker
from vllm_omni.worker.mixins import OmniWorkerMixin

from vllm_omni_token2wav.plugins.cpu_platform.worker.generation_model_runner import CPUGenerationModelRunner


class CPUGenerationWorker(OmniWorkerMixin, CPUWorker):
    model_runner_cls = CPUGenerationModelRunner

    def init_device(self) -> None:
        super().init_device()
        self.model_runner = self.model_runner_cls(self.vllm_config, self.device)


__all__ = ["CPUGenerationWorker"]
