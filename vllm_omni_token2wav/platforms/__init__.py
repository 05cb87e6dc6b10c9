# SPDX-License-Identifier: Apache-2.0
"""Platform layer: which device serves this process, and how to reach it.

`current_omni_platform` is detected lazily on first attribute access (PEP 562), so importing
`vllm_omni_token2wav` never imports torch_npu. The environment variable `VLLM_OMNI_TOKEN2WAV_PLATFORM`
(`auto` | `cpu` | `cuda` | `npu`) overrides detection; see `vllm_omni_token2wav.platforms.detect`.

Nothing here patches an upstream object: every patch (the graph-capture guard on `CUDAGraphWrapper` /
`ACLGraphWrapper` included, whose rule is `graph_capture_guard.py`) lives in `vllm_omni_token2wav/patch/`
and is installed by the plugin, never on import.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from vllm_omni_token2wav.platforms.device import DeviceSpec, device_key, normalize_device
from vllm_omni_token2wav.platforms.interface import DevicePlatform, PlatformEnum

if TYPE_CHECKING:
    current_omni_platform: DevicePlatform

__all__ = [
    "DeviceSpec",
    "DevicePlatform",
    "PlatformEnum",
    "current_omni_platform",
    "device_key",
    "get_current_platform",
    "normalize_device",
    "reset_current_platform",
]

# Process-wide: every stage of the process serves on one platform; the lock makes first
# detection happen once when stage workers start concurrently.
_platform_lock = threading.Lock()
_platform: DevicePlatform | None = None


def get_current_platform() -> DevicePlatform:
    global _platform
    if _platform is None:
        with _platform_lock:
            if _platform is None:
                from vllm_omni_token2wav.platforms.detect import detect_platform

                _platform = detect_platform()
    return _platform


def reset_current_platform(platform: DevicePlatform | None = None) -> None:
    """Forget the detected platform (or force `platform`). For tests and for `VLLM_OMNI_TOKEN2WAV_PLATFORM` changes."""
    global _platform
    with _platform_lock:
        _platform = platform


def __getattr__(name: str) -> Any:
    if name == "current_omni_platform":
        return get_current_platform()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
