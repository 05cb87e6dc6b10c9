# SPDX-License-Identifier: Apache-2.0
"""NVIDIA GPU serving through `torch.cuda` (the only module allowed to touch it directly)."""

from __future__ import annotations

from typing import Any

import torch

from vllm_omni_token2wav.platforms.graph_api import DeviceGraphApi, TorchGraphApi
from vllm_omni_token2wav.platforms.interface import DevicePlatform, PlatformEnum


class CudaDevicePlatform(DevicePlatform):
    _enum = PlatformEnum.CUDA
    device_type = "cuda"

    def device_module(self) -> Any:
        return torch.cuda

    def default_flow_dtype(self) -> torch.dtype:
        """float16: every CUDA GPU with tensor cores runs it at the bf16 rate (Volta and Turing have no bf16 at
        all), it keeps 3 more mantissa bits than bf16 (measured on the stand-ins: about 5x less mel
        deviation from fp32, docs/benchmarks/token2wav_precision.md), and it is the precision upstream already serves
        these flows in on CUDA (CosyVoice3's TensorRT estimator, `token2wav_float16`), so its range is proven
        on the real weights. `token2wav_dtype: bfloat16` is the choice if a checkpoint overflows fp16."""
        return torch.float16

    def device_graph_api(self) -> DeviceGraphApi | None:
        """CUDA graphs: `torch.cuda.CUDAGraph` captured with `torch.cuda.graph`."""
        return TorchGraphApi(torch.cuda, "CUDAGraph", "cuda-graph")

    def get_device_name(self, index: int | None = None) -> str:
        return str(torch.cuda.get_device_name(index if index is not None else self.current_device_index()))

    def device_count(self) -> int:
        return int(torch.cuda.device_count())

    def current_device_index(self) -> int | None:
        return int(torch.cuda.current_device())

    def synchronize(self, device: torch.device | str | int | None = None) -> None:
        torch.cuda.synchronize(device)
