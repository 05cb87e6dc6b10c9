# SPDX-License-Identifier: Apache-2.0
"""Append-only key/value storage of one flow stream: every Euler step x DiT block, both CFG branches.

In block-causal streaming every frame attends to all earlier chunks, so a stream must keep the keys
and values (after RoPE) of every finished frame, per Euler step and per block: at full size
10 steps x 22 blocks x 2 CFG rows x 2 (k, v) x 1024 channels = 3.6 MB per mel frame in float32
(180 MB per second of audio; half in float16). Concatenating that onto a new tensor every chunk would
copy the whole history each time, which is the O(N) cost streaming is meant to remove. Instead one
buffer per stream grows geometrically (x2, so each frame is copied O(1) times on average) and a chunk
writes only its own frames behind the committed ones.

The stream states stay immutable values: a state records how many frames it has committed, and an
arena is handed to a new chunk in place only if that state is the newest one built on it
(`length == committed`). A chunk that fails leaves `length` unchanged, so the old state still reads
exactly its frames; a chunk continued from an older state (a retry, a fork) gets a copy. Frames past
`length` are scratch: the current chunk's pending frames live there until the next chunk rewrites them.
One chunk at a time per stream (a request's chunks are sequential by nature); two concurrent chunks
continued from the same state would write the same scratch frames.

Layout `(steps, blocks, 2 CFG rows, heads, capacity, dim_head)`: the attention of (step, block) reads
the contiguous `[..., :end, :]` prefix as `(B, heads, end, dim_head)`.
"""

from __future__ import annotations

import torch


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class KVArena:
    def __init__(
        self,
        steps: int,
        blocks: int,
        rows: int,
        heads: int,
        dim_head: int,
        *,
        capacity: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        shape = (steps, blocks, rows, heads, capacity, dim_head)
        self.keys = torch.empty(shape, device=device, dtype=dtype)
        self.values = torch.empty(shape, device=device, dtype=dtype)
        #: frames committed by the newest state built on this arena
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.keys.size(4)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes

    def for_chunk(self, committed: int, end: int, *, granule: int, limit: int) -> KVArena:
        """An arena holding this one's first `committed` frames with room for `end`: self, or a grown copy.

        Grown capacity: the larger of `end` and twice the current one, rounded up to `granule` frames
        and capped at `limit` (but never below `end`).
        """
        if self.length == committed and end <= self.capacity:
            return self
        capacity = self.capacity if end <= self.capacity else max(end, min(limit, 2 * self.capacity))
        capacity = max(end, min(_round_up(capacity, granule), limit))
        steps, blocks, rows, heads, _, dim_head = self.keys.shape
        grown = KVArena(
            steps, blocks, rows, heads, dim_head, capacity=capacity, device=self.keys.device, dtype=self.keys.dtype
        )
        grown.keys[..., :committed, :] = self.keys[..., :committed, :]
        grown.values[..., :committed, :] = self.values[..., :committed, :]
        grown.length = committed
        return grown

    def write(self, step: int, block: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store `(rows, heads, n, dim_head)` keys / values of frames `[start, start + n)`."""
        end = start + keys.size(2)
        self.keys[step, block, :, :, start:end] = keys
        self.values[step, block, :, :, start:end] = values

    def read(self, step: int, block: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views `(rows, heads, end, dim_head)` of frames `[0, end)`."""
        return self.keys[step, block, :, :, :end], self.values[step, block, :, :, :end]

    def commit(self, length: int) -> None:
        """Mark frames `[0, length)` final for the newest state (called once the chunk has succeeded)."""
        self.length = length
