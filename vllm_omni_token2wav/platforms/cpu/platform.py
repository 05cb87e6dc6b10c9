# SPDX-License-Identifier: Apache-2.0
"""Plain CPU serving: no device module, no synchronisation, no device index."""

from __future__ import annotations

from vllm_omni_token2wav.platforms.interface import DevicePlatform, PlatformEnum


class CpuDevicePlatform(DevicePlatform):
    _enum = PlatformEnum.CPU
    device_type = "cpu"
