# SPDX-License-Identifier: Apache-2.0
"""Worker of an autoregressive stage (a talker, the stand-in producer) on CPU.

As `generation_worker.py`, with vLLM-Omni's AR model runner on `CPUModelRunner`.
"""

from __future__ import annotations

from vllm.v1.worker.cpu_worker import CPUWorker
from vllm_omni.worker.mixins import OmniWorkerMixin

from vllm_omni_token2wav.plugins.cpu_platform.worker.ar_model_runner import CPUARModelRunner


class CPUARWorker(OmniWorkerMixin, CPUWorker):
    model_runner_cls = CPUARModelRunner

    def init_device(self) -> None:
        super().init_device()
        self.model_runner = self.model_runner_cls(self.vllm_config, self.device)


__all__ = ["CPUARWorker"]
