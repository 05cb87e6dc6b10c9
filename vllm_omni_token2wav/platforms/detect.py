# SPDX-License-Identifier: Apache-2.0
"""Decide which platform serves this process.

| `VLLM_OMNI_TOKEN2WAV_PLATFORM` | result                                                                      |
|----------------------|-----------------------------------------------------------------------------|
| unset / `auto`       | NPU if `torch_npu` imports *and* `torch.npu.is_available()`, else CUDA if    |
|                      | `torch.cuda.is_available()`, else CPU                                       |
| `npu`                | NPU; raises `RuntimeError` naming the cause when torch_npu is unusable       |
| `cuda`               | CUDA; raises `RuntimeError` when no CUDA device is visible                   |
| `cpu`                | CPU, whatever hardware is present (useful to pin tests and benchmarks)      |

A `torch_npu` that is missing, or installed without CANN so that its import fails loading
`libhccl.so` & co. (ImportError / OSError), means "not NPU" in auto mode: logged at debug level,
never an exception.
"""

from __future__ import annotations

import importlib
import os

import torch

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.platforms.interface import DevicePlatform

logger = init_logger(__name__)

PLATFORM_ENV = "VLLM_OMNI_TOKEN2WAV_PLATFORM"
_CHOICES = ("auto", "cpu", "cuda", "npu")


def _npu_unavailable_reason() -> str | None:
    """None when an Ascend NPU is usable, else why not (import error text or 'no device')."""
    try:
        importlib.import_module("torch_npu")
    except (ImportError, OSError, RuntimeError) as exc:  # missing, or native libs fail to load without CANN
        return f"torch_npu cannot be imported: {exc.__class__.__name__}: {exc}"
    npu = getattr(torch, "npu", None)
    if npu is None:
        return "torch_npu imported but torch.npu is not registered"
    try:
        available = bool(npu.is_available())
    except Exception as exc:  # driver errors surface here on broken hosts
        return f"torch.npu.is_available() failed: {exc}"
    return None if available else "torch.npu.is_available() is False"


def _cuda_unavailable_reason() -> str | None:
    return None if torch.cuda.is_available() else "torch.cuda.is_available() is False"


def detect_platform() -> DevicePlatform:
    """Build the platform object from the environment (see the module table)."""
    from vllm_omni_token2wav.platforms.cpu.platform import CpuDevicePlatform
    from vllm_omni_token2wav.platforms.cuda.platform import CudaDevicePlatform
    from vllm_omni_token2wav.platforms.npu.platform import NpuDevicePlatform

    choice = os.environ.get(PLATFORM_ENV, "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"{PLATFORM_ENV}={choice!r} is not one of {', '.join(_CHOICES)}")
    if choice == "cpu":
        return CpuDevicePlatform()
    if choice == "npu":
        reason = _npu_unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"{PLATFORM_ENV}=npu but the NPU is not usable: {reason}")
        return NpuDevicePlatform()
    if choice == "cuda":
        reason = _cuda_unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"{PLATFORM_ENV}=cuda but CUDA is not usable: {reason}")
        return CudaDevicePlatform()

    reason = _npu_unavailable_reason()
    if reason is None:
        logger.debug("platform: Ascend NPU detected")
        return NpuDevicePlatform()
    logger.debug("platform: not NPU (%s)", reason)
    if _cuda_unavailable_reason() is None:
        logger.debug("platform: CUDA detected")
        return CudaDevicePlatform()
    logger.debug("platform: falling back to CPU")
    return CpuDevicePlatform()
