# SPDX-License-Identifier: Apache-2.0
"""The flow's starting noise: upstream's fixed table, or the same recipe under a per-request seed.

Upstream `CausalConditionalCFM.__init__` seeds every RNG with 0 (`set_all_random_seed(0)`) and then
draws `rand_noise = torch.randn([1, 80, 50 * 300])` on the CPU: a plain attribute (not in the
state_dict) holding 15000 frames (300 s at 50 Hz, prompt included). Every call slices it from frame
0 (`[:, :, :T]`), so frame f of any utterance, whole or any prefix re-run, starts from column f. That
is what makes upstream's streaming re-runs prefix-consistent, and what lets the cached streaming path
here start chunk frames at their absolute column.

`noise_table(seed)` draws the same shape from a private `torch.Generator().manual_seed(seed)`: for
seed 0 this is bit-identical to upstream's table (the CPU default generator seeded with 0 yields the
same Mersenne-Twister stream), without touching the process-wide RNG. Other seeds give a request its
own noise. Tables are cached process-wide per (seed, device, dtype): a table is 4.8 MB in float32 and
costs ~10 ms to draw; requests share them read-only.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

#: Frames in the noise table (upstream: 50 * 300); prompt + generated mel frames must fit.
NOISE_FRAMES = 15000
#: Upstream's seed (`set_all_random_seed(0)` just before drawing the table).
UPSTREAM_NOISE_SEED = 0
#: Distinct tables kept (LRU); per-request seeds beyond this are redrawn on reuse.
MAX_CACHED_TABLES = 8

# Process-wide: every flow instance and stream in the process reads the same immutable tables; the
# lock keeps concurrent first uses from drawing a table twice.
_tables: OrderedDict[tuple[int, int, str, torch.dtype], torch.Tensor] = OrderedDict()
_lock = threading.Lock()


def draw_noise_table(seed: int, channels: int = 80, frames: int = NOISE_FRAMES) -> torch.Tensor:
    """`randn(1, channels, frames)` from a CPU generator seeded with `seed` (float32, uncached)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, channels, frames, generator=gen, dtype=torch.float32)


def noise_table(
    seed: int = UPSTREAM_NOISE_SEED,
    *,
    channels: int = 80,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The cached `(1, channels, NOISE_FRAMES)` table for `seed` on `device` in `dtype` (do not modify it)."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise ValueError(f"flow noise: seed must be an int in [0, 2**63), got {seed!r}")
    device = torch.device(device)
    key = (seed, channels, str(device), dtype)
    with _lock:
        table = _tables.get(key)
        if table is not None:
            _tables.move_to_end(key)
            return table
        table = draw_noise_table(seed, channels).to(device=device, dtype=dtype)
        _tables[key] = table
        while len(_tables) > MAX_CACHED_TABLES:
            _tables.popitem(last=False)
        return table


def clear_noise_tables() -> None:
    """Drop the cached tables (tests; frees device memory)."""
    with _lock:
        _tables.clear()


def check_noise(noise: torch.Tensor, channels: int, frames: int, where: str) -> None:
    """`noise` is a `(1, channels, N)` table holding at least `frames` frames, or a clear error."""
    if noise.dim() != 3 or noise.size(0) != 1 or noise.size(1) != channels:
        raise ValueError(f"flow.{where}: noise has shape {tuple(noise.shape)}, expected (1, {channels}, N)")
    if frames > noise.size(2):
        raise ValueError(
            f"flow.{where}: {frames} mel frames (prompt + generated, {frames / 50:.1f} s) but the noise table holds "
            f"{noise.size(2)} ({noise.size(2) / 50:.0f} s, upstream's fixed limit); shorten the prompt or split "
            "the utterance"
        )
