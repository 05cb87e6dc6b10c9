# SPDX-License-Identifier: Apache-2.0
"""Ascend NPU serving through `torch.npu` (registered by `torch_npu` when it is imported)."""

from __future__ import annotations

from typing import Any

import torch

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.platforms.graph_api import DeviceGraphApi, TorchGraphApi, missing_graph_names
from vllm_omni_token2wav.platforms.interface import DevicePlatform, PlatformEnum

logger = init_logger(__name__)


class NpuDevicePlatform(DevicePlatform):
    _enum = PlatformEnum.NPU
    device_type = "npu"

    def device_module(self) -> Any:
        # `torch.npu` only exists after `import torch_npu`, which detection already did.
        return torch.npu  # type: ignore[attr-defined]

    def default_flow_dtype(self) -> torch.dtype:
        """float16: the dtype every Ascend generation computes natively (the 310P and 910A cube units have
        no bf16), with 3 more mantissa bits than bf16 (docs/benchmarks/token2wav_precision.md); vLLM-Omni's
        own NPU code2wav also refuses a bf16 attention cache. `token2wav_dtype: bfloat16` on a 910B if a
        checkpoint overflows fp16."""
        return torch.float16

    def device_graph_api(self) -> DeviceGraphApi | None:
        """NPU graphs: `torch.npu.NPUGraph` captured with `torch.npu.graph` (torch_npu >= 2.1).

        None, logged once, when the installed torch_npu has no graph API: the work then runs eagerly.
        """
        module = self.device_module()
        missing = missing_graph_names(module, "NPUGraph")
        if missing:
            logger.info_once("torch.npu has no %s: NPU graphs unavailable, running eagerly", ", ".join(missing))
            return None
        return TorchGraphApi(module, "NPUGraph", "npu-graph")

    def get_device_name(self, index: int | None = None) -> str:
        idx = index if index is not None else self.current_device_index()
        return str(self.device_module().get_device_name(idx))

    def device_count(self) -> int:
        return int(self.device_module().device_count())

    def current_device_index(self) -> int | None:
        return int(self.device_module().current_device())

    def synchronize(self, device: torch.device | str | int | None = None) -> None:
        module = self.device_module()
        if device is None:
            module.synchronize()
        else:
            module.synchronize(device)
