# SPDX-License-Identifier: Apache-2.0
"""Plan the padded CAM++ launches of a batch of utterances (which rows go together, at what shape).

`CampplusTorch.embed_batch` embeds utterances of different lengths. Each launch pads its rows to
one frame bucket (`buckets.campplus_frame_buckets()`) and, where graphs are replayed per shape
(accelerators), its row count to a batch bucket (`buckets.batch_buckets()`), so the launch shapes
come from two small fixed sets: oneDNN primitives and captured graphs are reused instead of being
rebuilt for every prompt length. Padding is exact (`campplus.masking`), so a row's embedding does
not depend on the launch it ran in.

The plan is plain data (printable, testable without a model):
- utterances are grouped by their frame bucket; lengths above the largest bucket form one group
  padded to its own longest member (an exact, un-bucketed shape: counted as such by callers);
- a group larger than the largest batch bucket is split into chunks of that size;
- `pad_rows` rounds each chunk's row count up to a batch bucket (the dummy rows are all-zero
  features, computed and dropped).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vllm_omni_token2wav.model_executor.buckets import Buckets


@dataclass(frozen=True)
class Launch:
    """One padded CAM++ call: `indices` (positions in the request list) at `rows` x `frames`."""

    indices: tuple[int, ...]
    frames: int  # padded T: a frame bucket, or the group's longest length above the largest bucket
    rows: int  # padded B: len(indices), or the batch bucket holding it when rows are padded
    bucketed: bool  # False when the frames are above the largest bucket (an exact shape)


def plan_launches(
    lengths: Sequence[int], frame_buckets: Buckets, batch_buckets: Buckets, *, pad_rows: bool
) -> list[Launch]:
    """Group utterances of `lengths` frames into launches (order: by frames, then request order)."""
    if not lengths:
        raise ValueError("plan_launches needs at least one utterance length, got none")
    groups: dict[int | None, list[int]] = {}
    for index, length in enumerate(lengths):
        if length < 1:
            raise ValueError(f"utterance {index} has {length} frames; lengths must be positive")
        groups.setdefault(frame_buckets.round_up(length), []).append(index)
    launches = []
    chunk = batch_buckets.largest
    for bucket in sorted(groups, key=lambda b: float("inf") if b is None else b):
        members = groups[bucket]
        frames = bucket if bucket is not None else max(lengths[i] for i in members)
        for start in range(0, len(members), chunk):
            indices = tuple(members[start : start + chunk])
            rows = batch_buckets.round_up(len(indices)) if pad_rows else None
            launches.append(Launch(indices, frames, rows or len(indices), bucket is not None))
    return launches


__all__ = ["Launch", "plan_launches"]
