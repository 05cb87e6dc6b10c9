# SPDX-License-Identifier: Apache-2.0
"""vLLM-Omni's platform for CPU-only hosts: omni stages (generation and AR) on the CPU build of vLLM.

vLLM-Omni 0.30 ships platforms for CUDA, ROCm, NPU, XPU and MUSA; on a host with none of them it
resolves `UnspecifiedOmniPlatform`, whose `get_omni_generation_worker_cls()` raises
`NotImplementedError` (and `GPUGenerationWorker.init_device` refuses the CPU device). This platform
follows upstream's XPU pattern: `CpuEnginePlatform` is an `OmniPlatform` over vLLM's
`CpuPlatform`, and its workers combine vLLM's `CPUWorker` with `OmniWorkerMixin`, and vLLM-Omni's
generation / AR model runners with vLLM's `CPUModelRunner` (`worker/`). The V1 model runner is used
(vLLM's V2 runner needs Triton, which the CPU build does not use).

It activates only when no accelerator platform applies: vLLM-Omni gives an out-of-tree platform
plugin precedence over its built-in ones, so `cpu_platform_plugin()` first asks each built-in
detector (CUDA, ROCm, NPU, XPU, MUSA) and returns None when any of them claims the host. On those
hosts upstream's platform and workers run our stage classes unchanged.

CPU facts that shape deployments (`vllm_omni_token2wav/deploy/*.yaml` set them): vLLM's CPU worker
reserves `gpu_memory_utilization` x the node's memory unless `kv_cache_memory_bytes` is given, so
every stage sets a small explicit KV cache; stages run eager (`enforce_eager`); one "device" (the
CPU) means vLLM-Omni initialises stages one after another under its device-0 lock. vLLM-Omni's
diffusion attention has no CPU forward (upstream's CosyVoice3 code2wav DiT uses it): the platform
names `diffusion_attention.CPUSDPABackend`, upstream's torch SDPA with one.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.platforms.cpu import CpuPlatform
from vllm_omni.platforms.interface import OmniPlatform, OmniPlatformEnum

from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

_WORKERS = "vllm_omni_token2wav.plugins.cpu_platform.worker"


class CpuEnginePlatform(OmniPlatform, CpuPlatform):
    """vLLM's `CpuPlatform` with vLLM-Omni's stage interfaces (see the module docstring)."""

    _omni_enum = OmniPlatformEnum.OOT

    @classmethod
    def get_omni_ar_worker_cls(cls) -> str:
        return f"{_WORKERS}.ar_worker.CPUARWorker"

    @classmethod
    def get_omni_generation_worker_cls(cls) -> str:
        return f"{_WORKERS}.generation_worker.CPUGenerationWorker"

    @classmethod
    def get_default_stage_config_path(cls) -> str:
        return "vllm_omni/deploy"

    @classmethod
    def get_torch_device(cls, local_rank: int | None = None) -> torch.device:
        return torch.device("cpu")

    @classmethod
    def get_device_count(cls) -> int:
        return 1

    @classmethod
    def get_device_version(cls) -> str | None:
        return None

    @classmethod
    def synchronize(cls) -> None:
        return None

    @classmethod
    def supports_torch_inductor(cls) -> bool:
        return False

    @classmethod
    def get_free_memory(cls, device: Any = None) -> int:
        import psutil

        return int(psutil.virtual_memory().available)

    @classmethod
    def get_device_memory(cls, device: Any = None) -> tuple[int, int]:
        import psutil

        memory = psutil.virtual_memory()
        return int(memory.available), int(memory.total)

    @classmethod
    def get_diffusion_attn_backend_cls(
        cls, selected_backend: str | None, head_size: int, allow_trtllm_default: bool = False
    ) -> str:
        # upstream's torch SDPA, with a forward for the CPU (upstream's raises on any non-accelerator platform)
        return "vllm_omni_token2wav.plugins.cpu_platform.diffusion_attention.CPUSDPABackend"


def accelerator_platform() -> str | None:
    """The name of the first built-in vLLM-Omni platform that claims this host, or None."""
    from vllm_omni.platforms import builtin_omni_platform_plugins

    for name, detect in builtin_omni_platform_plugins.items():
        try:
            if detect() is not None:
                return name
        except Exception:  # a detector that cannot run means its platform does not apply
            logger.debug("vLLM-Omni platform detector %s failed", name, exc_info=True)
    return None


def cpu_platform_plugin() -> str | None:
    """`CpuEnginePlatform`'s class path on a host no accelerator platform claims, else None."""
    claimed = accelerator_platform()
    if claimed is not None:
        logger.debug("%s platform applies: the CPU omni platform stays inactive", claimed)
        return None
    return f"{__name__}.CpuEnginePlatform"


__all__ = ["CpuEnginePlatform", "accelerator_platform", "cpu_platform_plugin"]
