# SPDX-License-Identifier: Apache-2.0
"""Normalise device specs to an explicit `torch.device`, for cache keys and placement.

`"npu"`, `"npu:0"` and `torch.device("npu", 0)` must name the same cache entry, so a device type
that has indices always gets one (the backend's current device when none is given, 0 when the
backend cannot say). CPU has no index: `torch.cpu.current_device()` returns the string "cpu", and
`"cpu:0"` normalises to plain `cpu`.
"""

from __future__ import annotations

import torch

DeviceSpec = str | torch.device | int | None

_INDEXED_TYPES = ("cuda", "npu", "xpu", "hpu", "mtia", "privateuseone")


def _current_index(device_type: str) -> int:
    module = getattr(torch, device_type, None)
    if module is None:
        return 0
    try:
        if hasattr(module, "is_available") and not module.is_available():
            return 0
        index = module.current_device()
    except Exception:  # backends without a runtime on this host
        return 0
    return index if isinstance(index, int) else 0


def normalize_device(spec: DeviceSpec) -> torch.device:
    """Return `spec` as an explicit `torch.device`.

    `None` means the serving device of `current_omni_platform`; an `int` means that index of the
    serving device type. Raises `ValueError` for anything that is not a device spec.
    """
    if spec is None or isinstance(spec, int):
        if isinstance(spec, bool):
            raise ValueError(f"device spec must be a str, torch.device or int, got bool {spec!r}")
        from vllm_omni_token2wav.platforms import current_omni_platform

        platform = current_omni_platform
        if isinstance(spec, int) and platform.device_type == "cpu":
            raise ValueError(f"device index {spec} given but the serving platform is CPU, which has no index")
        if isinstance(spec, int) and spec < 0:
            raise ValueError(f"device index must be >= 0, got {spec}")
        return platform.torch_device(spec)
    if isinstance(spec, torch.device):
        device = spec
    elif isinstance(spec, str):
        text = spec.strip()
        if not text:
            raise ValueError("device spec is an empty string; expected e.g. 'cpu', 'cuda:0' or 'npu:1'")
        try:
            device = torch.device(text)
        except RuntimeError as exc:
            head = text.split(":", 1)[0]
            hint = " (is torch_npu installed and imported?)" if head == "npu" else ""
            raise ValueError(f"invalid device spec {spec!r}{hint}: {exc}") from None
    else:
        raise ValueError(f"device spec must be a str, torch.device or int, got {type(spec).__name__} {spec!r}")

    if device.type == "cpu":
        return torch.device("cpu")
    if device.index is not None:
        if device.index < 0:
            raise ValueError(f"device index must be >= 0 in {spec!r}")
        return device
    if device.type in _INDEXED_TYPES or torch._C._get_privateuse1_backend_name() == device.type:
        return torch.device(device.type, _current_index(device.type))
    return device


def device_key(spec: DeviceSpec) -> str:
    """`str(normalize_device(spec))`: a stable string for process caches (`'npu:0'`, `'cpu'`)."""
    return str(normalize_device(spec))
