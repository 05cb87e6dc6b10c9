# SPDX-License-Identifier: Apache-2.0
"""The stage's memory budget: how many bytes its streams may hold, and what a new stream will cost.

A stream's caches are the stage's memory (CosyVoice3's exact K/V arena grows with every mel frame,
CosyVoice2's trimmed cache holds `P + 100` frames; docs/design/token2wav_stage.md, "Memory"), and
nothing else bounds them: without a budget eight long CosyVoice3 replies run the host out of memory.
`token2wav_memory_budget` (a stage option, `options.py`) caps the bytes the live streams hold;
`Token2WavStepExecutor` (`step_executor.py`) makes a new stream that would exceed it wait, and
refuses one that could never fit alone ("Memory budget" in docs/design/token2wav_stage.md).

| value                          | budget                                                               |
|--------------------------------|----------------------------------------------------------------------|
| `auto` (default), absent       | `AUTO_SHARE` of the device's free memory at stage start (the platform |
|                                | object's `free_memory`), on CPU of the host's `MemAvailable`          |
| an int, or `"8GiB"`, `"500MB"` | that many bytes (decimal and binary units)                            |
| `off`, `0`                     | no budget (streams are only bounded by `token2wav_max_streams`)       |

What a stream costs is measured, not assumed: `BytesModel` keeps the largest own-bytes-per-token
ratio seen on this stage's committed streams (`backend.stream_bytes` after each chunk, divided by
the tokens the stream has received), seeded by the backend's `stream_bytes_per_token(voice)` where
it has one. A new stream's estimate is that ratio times the tokens known at its admission.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import torch

from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

#: The share of free device memory (CPU: of `MemAvailable`) an `auto` budget takes at stage start. The
#: rest stays for the models' weights and activations of a step, other stages on the device, and the host.
AUTO_SHARE = 0.5

OPTION = "token2wav_memory_budget"

#: Codec tokens per audio second of every family served (MiniCPM-o 4.5, Step-Audio2, CosyVoice3: 25 Hz):
#: turns `token2wav_stream_reserve_s` into the tokens a new stream reserves.
TOKENS_PER_SECOND = 25

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([a-z]*)\s*$")


def parse_memory_budget(value: Any) -> int | None:
    """`token2wav_memory_budget` -> bytes (0: no budget) or None (`auto`); raise ValueError naming the key."""
    expected = "a positive number of bytes (an int, or a string such as '8GiB' or '500MB'), 'auto' or 'off'"
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{OPTION} must be {expected}, got {value!r}")
    if isinstance(value, int | float):
        if value < 0 or value != value:  # noqa: PLR0124 - NaN check
            raise ValueError(f"{OPTION} must be {expected}, got {value!r}")
        return int(value)
    text = str(value).strip().lower()
    if text in ("auto", ""):
        return None
    if text in ("off", "none"):
        return 0
    match = _SIZE.match(text)
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(f"{OPTION} must be {expected}, got {value!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def host_available_bytes() -> int | None:
    """`MemAvailable` of /proc/meminfo (Linux), else the physical pages the OS reports free, else None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def auto_memory_budget(device: torch.device, platform: Any) -> int | None:
    """`AUTO_SHARE` of the free memory of `device` (a CPU: of the host's available RAM); None if unknown (an
    accelerator whose runtime gives no figure: host RAM says nothing about the device's memory)."""
    free = host_available_bytes() if device.type == "cpu" else platform.free_memory(device)
    return int(free * AUTO_SHARE) if free is not None else None


def resolve_memory_budget(option: int | None, device: torch.device, platform: Any) -> int | None:
    """The stage's budget in bytes from the parsed option (None: no budget, as with `off`)."""
    if option is None:
        budget = auto_memory_budget(device, platform)
        if budget is None:
            logger.warning("token2wav stage: %s=auto found no free-memory figure for %s; no budget", OPTION, device)
        return budget
    return option or None


@dataclass
class BytesModel:
    """A stream's own bytes per received token, the largest ratio measured so far (0: nothing measured yet)."""

    per_token: float = 0.0

    def observe(self, tokens: int, own_bytes: int) -> None:
        if tokens > 0:
            self.per_token = max(self.per_token, own_bytes / tokens)

    def estimate(self, tokens: int) -> int:
        return int(self.per_token * max(tokens, 0))


@dataclass(frozen=True)
class MemorySnapshot:
    """What the stage stats report about the budget after a step."""

    budget_bytes: int | None
    live_bytes: int
    waiting_streams: int
    waiting_bytes: int
    bytes_per_token: float


__all__ = [
    "AUTO_SHARE",
    "OPTION",
    "TOKENS_PER_SECOND",
    "BytesModel",
    "MemorySnapshot",
    "auto_memory_budget",
    "host_available_bytes",
    "parse_memory_budget",
    "resolve_memory_budget",
]
