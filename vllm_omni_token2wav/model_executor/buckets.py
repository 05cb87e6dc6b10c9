# SPDX-License-Identifier: Apache-2.0
"""Shape buckets: the one place that decides which padded shapes the device paths run at.

Graph capture (CUDA graphs, NPU graphs) replays a recorded kernel sequence for one exact input
shape, and oneDNN / cuDNN primitives are built per shape too. A serving stage sees many shapes
(prompt lengths, batch sizes, chunk lengths), so the device paths pad each call up to the smallest
*bucket* that holds it and mask the padding exactly (each model documents how). Keeping the bucket
sets here means CAM++, the flow estimator, HiFT and the capture helper agree on them, and a
deployment changes them in one place (environment variables below, read on every call).

| set                      | default                 | used for                     | override variable           |
|--------------------------|-------------------------|------------------------------|-----------------------------|
| `campplus_frame_buckets` | multiples of 64 ..3008  | CAM++ fbank frames (100 Hz)  | `VLLM_OMNI_TOKEN2WAV_` +    |
|                          |                         |                              | `CAMPP_FRAME_BUCKETS`       |
| `batch_buckets`          | 1, 2, 4, 8, 16, 32      | rows of one batched launch   | `..._BATCH_BUCKETS`         |
| `stage_frame_buckets`    | 16-grid ..256, 64-grid  | mel frames of a stage launch | `..._STAGE_FRAME_BUCKETS`   |
|                          | ..1024, 128-grid ..2048 |                              |                             |

A spec string is a comma-separated list of entries, each a size (`"1,2,4,8"`) or a range
`"STEP:LIMIT"`: the multiples of STEP above the sizes before it, up to and including the first
multiple >= LIMIT (`"64:3000"`; `"16:256,64:1024"` is 16, 32, ..., 256, 320, ..., 1024). A size
above the largest bucket has no bucket (`round_up` returns None): callers then run that call at its
exact shape, eagerly, and count it as a miss.

Why the stage grid gets coarser: a flow launch holds up to `max_num_seqs` (32) chunks of at most
56 mel frames, so its frames reach 1792. Each bucket a launch can land in is one more captured graph
set per capture helper (and the device memory of its static buffers), while the padding a bucket
adds is wasted work: 16 frames of padding matter at 50 frames (one chunk), 128 do not at 1600. The
three grids pad by at most 15 / 63 / 127 frames (<= 25 % of a launch above 256 frames, <= 13 % above
1024) with 36 buckets, where a 16-grid to 2048 would have 128.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass

#: CAM++ input frames: 64-frame grid up to 3008 (>= 3000 frames, the 30 s prompt limit at 100 Hz).
DEFAULT_CAMPP_FRAME_BUCKETS = "64:3000"
#: Rows of a batched launch (requests of one step, before the CFG doubling).
DEFAULT_BATCH_BUCKETS = "1,2,4,8,16,32"
#: Mel frames of a flow launch: 16-frame grid to 256, 64 to 1024, 128 to 2048 (32 rows x 56 frames = 1792).
DEFAULT_STAGE_FRAME_BUCKETS = "16:256,64:1024,128:2048"


@dataclass(frozen=True)
class Buckets:
    """A sorted set of sizes; `round_up(n)` is the smallest size >= n (None above the largest)."""

    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.sizes:
            raise ValueError("Buckets: at least one size is required")
        if any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in self.sizes):
            raise ValueError(f"Buckets: sizes must be positive ints, got {self.sizes!r}")
        if list(self.sizes) != sorted(set(self.sizes)):
            raise ValueError(f"Buckets: sizes must be strictly increasing, got {self.sizes!r}")

    @classmethod
    def multiples(cls, step: int, limit: int) -> Buckets:
        """`step, 2 step, ...` up to the first multiple >= `limit`."""
        if step < 1 or limit < 1:
            raise ValueError(f"Buckets.multiples: step and limit must be >= 1, got {step} and {limit}")
        count = -(-limit // step)
        return cls(tuple(step * i for i in range(1, count + 1)))

    @classmethod
    def parse(cls, spec: str, *, what: str = "buckets") -> Buckets:
        """Comma-separated sizes and `STEP:LIMIT` ranges (module docstring); a clear error naming `what` otherwise."""
        sizes: list[int] = []
        try:
            for entry in (part.strip() for part in spec.split(",")):
                if not entry:
                    continue
                if ":" in entry:
                    step, limit = (int(part) for part in entry.split(":"))
                    sizes += [s for s in cls.multiples(step, limit).sizes if not sizes or s > sizes[-1]]
                else:
                    sizes.append(int(entry))
            return cls(tuple(sizes))
        except ValueError as exc:
            raise ValueError(
                f"{what}: cannot parse bucket spec {spec!r} ({exc}); use comma-separated increasing sizes like "
                "'1,2,4,8' and/or STEP:LIMIT ranges like '64:3000' or '16:256,64:1024'"
            ) from exc

    @property
    def largest(self) -> int:
        return self.sizes[-1]

    def round_up(self, n: int) -> int | None:
        """The smallest bucket >= `n`, or None when `n` is above the largest bucket (run it exactly)."""
        if n < 0:
            raise ValueError(f"Buckets.round_up: size must be >= 0, got {n}")
        index = bisect.bisect_left(self.sizes, n)
        return self.sizes[index] if index < len(self.sizes) else None

    def __contains__(self, n: object) -> bool:
        return n in self.sizes

    def __len__(self) -> int:
        return len(self.sizes)


def _from_env(variable: str, default: str) -> Buckets:
    return Buckets.parse(os.environ.get(variable) or default, what=variable)


def campplus_frame_buckets() -> Buckets:
    """Frame buckets of CAM++ calls (fbank frames at 100 Hz)."""
    return _from_env("VLLM_OMNI_TOKEN2WAV_CAMPP_FRAME_BUCKETS", DEFAULT_CAMPP_FRAME_BUCKETS)


def batch_buckets() -> Buckets:
    """Row-count buckets of batched launches (CAM++ `embed_batch`, flow estimator, HiFT)."""
    return _from_env("VLLM_OMNI_TOKEN2WAV_BATCH_BUCKETS", DEFAULT_BATCH_BUCKETS)


def stage_frame_buckets() -> Buckets:
    """Mel-frame buckets of Token2Wav stage launches (50 Hz frames)."""
    return _from_env("VLLM_OMNI_TOKEN2WAV_STAGE_FRAME_BUCKETS", DEFAULT_STAGE_FRAME_BUCKETS)


__all__ = [
    "DEFAULT_BATCH_BUCKETS",
    "DEFAULT_CAMPP_FRAME_BUCKETS",
    "DEFAULT_STAGE_FRAME_BUCKETS",
    "Buckets",
    "batch_buckets",
    "campplus_frame_buckets",
    "stage_frame_buckets",
]
