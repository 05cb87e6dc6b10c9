# SPDX-License-Identifier: Apache-2.0
"""Per-device cache of the front end's constant tensors (windows, filter banks, DFT bases).

The constants are built once on the host in float64 (so their values do not depend on the device's
arithmetic), cast to float32 and copied to the device the first time a (name, parameters, device)
combination is asked for. Every later call reuses the device copy, which keeps the per-request path
free of host-to-device copies.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable

import torch

# Process-wide because the constants are pure functions of their parameters and device, and building
# them per request would put a host->device copy on every request; the lock keeps concurrent stage
# threads from building the same entry twice.
_CONSTANTS_LOCK = threading.Lock()
_CONSTANTS: dict[tuple[Hashable, ...], torch.Tensor] = {}


def device_constant(
    name: str, params: tuple[Hashable, ...], device: torch.device, build: Callable[[], torch.Tensor]
) -> torch.Tensor:
    """The float32 tensor `build()` (a CPU tensor) on `device`, built and copied once per process."""
    key = (name, params, str(device))
    with _CONSTANTS_LOCK:
        cached = _CONSTANTS.get(key)
        if cached is None:
            cached = build().to(dtype=torch.float32).to(device, non_blocking=True)
            _CONSTANTS[key] = cached
        return cached


def clear_constants() -> None:
    """Drop every cached constant (tests; frees device memory after a device is retired)."""
    with _CONSTANTS_LOCK:
        _CONSTANTS.clear()
