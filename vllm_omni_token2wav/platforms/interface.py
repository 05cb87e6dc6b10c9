# SPDX-License-Identifier: Apache-2.0
"""Our device-facing platform object: the one place that knows which accelerator serves this process.

Not vLLM-Omni's engine platform (`vllm_omni.platforms.interface.OmniPlatform`, which picks workers and
attention backends for the engine; ours for CPU-only hosts is `plugins/cpu_platform/platform.py`):
`DevicePlatform` is what our model code asks about the device it runs on.

Model code asks `current_omni_platform` (`is_npu()`, `torch_device()`, `synchronize()`) instead of
calling `torch.cuda` / `torch.npu` itself, so the same module runs unchanged on Ascend NPUs, NVIDIA
GPUs and plain CPUs. Subclasses only differ in how they reach the device module.
"""

from __future__ import annotations

import enum
import platform as _py_platform
from typing import TYPE_CHECKING, Any

import torch

from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

if TYPE_CHECKING:
    from vllm_omni_token2wav.platforms.graph_api import DeviceGraphApi

#: Device-module functions `memory_stats` reads (torch.cuda and torch.npu both have them).
_MEMORY_FUNCTIONS = {
    "allocated_bytes": "memory_allocated",
    "reserved_bytes": "memory_reserved",
    "peak_allocated_bytes": "max_memory_allocated",
}


class PlatformEnum(enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"
    NPU = "npu"


class DevicePlatform:
    """Base platform. `device_type` is the torch device type string of the serving device."""

    _enum: PlatformEnum = PlatformEnum.CPU
    device_type: str = "cpu"

    def is_cpu(self) -> bool:
        return self._enum is PlatformEnum.CPU

    def is_cuda(self) -> bool:
        return self._enum is PlatformEnum.CUDA

    def is_npu(self) -> bool:
        return self._enum is PlatformEnum.NPU

    @property
    def device_name(self) -> str:
        """Human-readable name of the serving device (for reports and cache keys)."""
        return self.get_device_name(None)

    def get_device_name(self, index: int | None = None) -> str:
        return _py_platform.processor() or _py_platform.machine() or "cpu"

    def device_count(self) -> int:
        return 1

    def current_device_index(self) -> int | None:
        """Index of the current device of this platform; None for device types without an index (CPU)."""
        return None

    def torch_device(self, index: int | None = None) -> torch.device:
        """The serving device as an explicit `torch.device` (with an index where the type has one)."""
        if self.device_type == "cpu":
            return torch.device("cpu")
        if index is None:
            index = self.current_device_index() or 0
        return torch.device(self.device_type, index)

    def synchronize(self, device: torch.device | str | int | None = None) -> None:
        """Wait for all queued work on `device` (no-op on CPU, where work is synchronous)."""

    def device_module(self) -> Any:
        """`torch.cuda` / `torch.npu` / `torch.cpu`."""
        return torch.cpu

    def default_flow_dtype(self) -> torch.dtype:
        """The dtype a Token2Wav flow runs in when the deployment does not choose one (`token2wav_dtype: auto`).

        float32 here and on CPU: a CPU has no reduced-precision matrix units to gain from (bf16 / fp16 GEMMs
        there run through conversions), so reduced precision would only cost accuracy. Accelerator
        platforms answer a reduced dtype (`CudaDevicePlatform`, `NpuDevicePlatform`); the measured bound per
        family is in docs/benchmarks/token2wav_precision.md.
        """
        return torch.float32

    def device_graph_api(self) -> DeviceGraphApi | None:
        """The graph-capture runtime of this platform, or None where work runs eagerly (CPU).

        Used by `platforms.device_graphs.DeviceGraphRunner`; see docs/design/device_graphs.md.
        """
        return None

    def memory_stats(self, device: torch.device | None = None) -> dict[str, int] | None:
        """Allocator bytes on `device` (allocated, reserved, peak allocated), or None where torch keeps none."""
        module = self.device_module()
        if not all(hasattr(module, fn) for fn in _MEMORY_FUNCTIONS.values()):
            return None
        target = device if device is not None else self.torch_device()
        return {key: int(getattr(module, fn)(target)) for key, fn in _MEMORY_FUNCTIONS.items()}

    def free_memory(self, device: torch.device | None = None) -> int | None:
        """Free bytes on `device` as the device runtime reports them (`mem_get_info`), or None where it has none
        or cannot answer.

        The CPU platform answers None: host memory is read by the caller (the stage's memory budget reads
        `MemAvailable`, `token2wav_stage/memory_budget.py`).
        """
        module = self.device_module()
        if self.is_cpu() or not hasattr(module, "mem_get_info"):
            return None
        target = device if device is not None else self.torch_device()
        try:
            free, _total = module.mem_get_info(target)
        except (RuntimeError, AssertionError) as exc:  # a runtime that cannot answer (no driver, a CPU-only build)
            logger.warning(
                "%s: no free-memory figure for %s (%s: %s)", type(self).__name__, target, type(exc).__name__, exc
            )
            return None
        return int(free)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device_type={self.device_type!r})"
