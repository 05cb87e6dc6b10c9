# SPDX-License-Identifier: Apache-2.0
"""The estimator's attention cache of one stream, with the post-prompt part shared between streams.

The estimator (DiT) attention cache is by far the largest per-stream state: per cached mel frame it
holds `n_timesteps x depth x 2 (CFG) x heads x 2 head_dim` values, 1.31 MB in fp32 at the shipped
geometry (10 x 16 x 2 x 8 x 128 x 4 B). Its time axis is newest-first (`cat([new, cached])`, see
`dit.py`) and after every chunk it is trimmed, when longer than `P + tail` (P = prompt mel frames,
tail = 100), to its first P and last `tail` frames (`streaming.trim_time`).

Right after `setup_cache` the whole cache is the prompt's (P frames). The trim keeps the last
`tail` frames of the sequence, which are the last `tail` prompt frames: identical for every stream of
the same voice and never modified. `EstimatorKV` therefore stores a stream's cache as

    logical = cat([own, base[..., base_from:, :]], time)

with `base` the setup cache of the voice (shared, read-only) and `own` what this stream computed
(plus any base frames the trim kept out of order, copied). `plan_trim` decides, from lengths only,
which frames of the untrimmed `[new | own | base[base_from:]]` a chunk keeps as its new `own` and
where the shared suffix starts; the kernel writes `own` directly, so the cache is never materialised
and then trimmed. `materialize()` gives the reference layout (tests, debugging).

`own` may be stored in a narrower dtype than the estimator computes in (the opt-in
`kv_dtype=torch.bfloat16`): frames are widened when they are read and rounded when they are written.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Time axis of the estimator cache `(n, depth, 2, heads, t, 2 head_dim)`.
TIME_DIM = 4


@dataclass(frozen=True)
class TrimPlan:
    """Which frames of the untrimmed `[new | own | base[base_from:]]` (full coordinates) a chunk keeps.

    `own_ranges`: `(start, end)` ranges copied, in order, into the new `own`; `base_from`: where the
    shared base suffix starts afterwards.
    """

    own_ranges: tuple[tuple[int, int], ...]
    base_from: int

    @property
    def own_frames(self) -> int:
        return sum(end - start for start, end in self.own_ranges)


def plan_trim(new: int, own: int, base_len: int, base_from: int, keep_head: int, keep_tail: int) -> TrimPlan:
    """The trim of `streaming.trim_time` (keep the first `keep_head` and last `keep_tail` frames when
    longer than their sum) expressed on the split representation, from lengths only."""
    base_visible = base_len - base_from
    if min(new, own, base_visible, keep_head, keep_tail) < 0:
        raise ValueError(f"plan_trim: negative length in {(new, own, base_len, base_from, keep_head, keep_tail)}")
    total = new + own + base_visible
    if total <= keep_head + keep_tail:
        kept = [(0, total)]
    else:
        kept = [(0, keep_head), (total - keep_tail, total)]
    split = new + own  # full index where the base frames begin
    # The last kept range always ends at `total`; its part inside the base is a suffix of the base.
    suffix_start = max(kept[-1][0], split)
    own_ranges = []
    for start, end in kept:
        end = min(end, suffix_start)
        if end > start:
            own_ranges.append((start, end))
    return TrimPlan(tuple(own_ranges), base_from + max(suffix_start - split, 0))


@dataclass(frozen=True)
class EstimatorKV:
    """One stream's estimator attention cache: `cat([own, base[..., base_from:, :]], time)` (newest first)."""

    own: torch.Tensor
    base: torch.Tensor
    base_from: int

    def __post_init__(self) -> None:
        if self.own.dim() != 6 or self.base.dim() != 6 or self.own.shape[:4] != self.base.shape[:4]:
            raise ValueError(
                f"EstimatorKV: own {tuple(self.own.shape)} and base {tuple(self.base.shape)} must both be "
                "(n, depth, 2, heads, t, 2 * head_dim) with equal leading dims"
            )
        if not 0 <= self.base_from <= self.base.shape[TIME_DIM]:
            raise ValueError(f"EstimatorKV: base_from {self.base_from} outside [0, {self.base.shape[TIME_DIM]}]")

    @classmethod
    def from_setup(cls, att_cache: torch.Tensor, dtype: torch.dtype | None = None) -> EstimatorKV:
        """The cache right after `setup_cache`: nothing own, the whole (shared) setup cache as base."""
        base = att_cache if dtype is None else att_cache.to(dtype)
        own = base.new_empty((*base.shape[:TIME_DIM], 0, base.shape[5]))
        return cls(own=own, base=base, base_from=0)

    @property
    def own_frames(self) -> int:
        return int(self.own.shape[TIME_DIM])

    @property
    def base_frames(self) -> int:
        """Visible frames of the shared base."""
        return int(self.base.shape[TIME_DIM]) - self.base_from

    @property
    def frames(self) -> int:
        """Logical cache length: the noise offset of the next chunk."""
        return self.own_frames + self.base_frames

    @property
    def dtype(self) -> torch.dtype:
        return self.own.dtype

    def step_block(self, step: int, block: int, dtype: torch.dtype) -> list[torch.Tensor]:
        """The parts `[own, base]` of Euler step `step`, block `block` as `(2, heads, t, 2 hd)` in `dtype`."""
        parts = []
        if self.own_frames:
            parts.append(self.own[step, block].to(dtype))
        if self.base_frames:
            parts.append(self.base[step, block, :, :, self.base_from :].to(dtype))
        return parts

    def materialize(self) -> torch.Tensor:
        """The reference layout `(n, depth, 2, heads, frames, 2 head_dim)` (a new tensor)."""
        return torch.cat([self.own, self.base[:, :, :, :, self.base_from :].to(self.own.dtype)], dim=TIME_DIM)

    @property
    def own_nbytes(self) -> int:
        return self.own.numel() * self.own.element_size()

    @property
    def base_nbytes(self) -> int:
        """Bytes of the whole shared base tensor (held once per voice, however many streams use it)."""
        return self.base.numel() * self.base.element_size()


__all__ = ["TIME_DIM", "EstimatorKV", "TrimPlan", "plan_trim"]
