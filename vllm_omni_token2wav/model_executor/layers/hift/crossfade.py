# SPDX-License-Identifier: Apache-2.0
"""The vocoder side of chunked HiFT streaming: how much a chunk carries over, and the cross-fade.

Step-Audio2 / MiniCPM-o stream HiFT chunk by chunk (the reference's `token2wav.py`): the last
`MEL_CACHE_FRAMES` mel frames are vocoded again at the start of the next chunk, `SOURCE_CACHE_SAMPLES`
NSF source samples carry over (phase continuity), and the first `SOURCE_CACHE_SAMPLES` output samples
are blended with the tail the previous chunk held back. Both the batched HiFT rows (`batched.py`) and
the core's stream state (`token2wav_core/stream.py`) use these, so they live beside HiFT.

Cross-fade: `w = hamming(2 * 3840)` (float64, symmetric, `np.hamming`); the first 3840 samples of a
chunk become `new[:3840] * w[:3840] + tail * w[3840:]`, computed in float64 and cast back, as the
reference blends float32 audio with a float64 window.
"""

from __future__ import annotations

import numpy as np
import torch

MEL_CACHE_FRAMES = 8
SAMPLES_PER_FRAME = 480
SOURCE_CACHE_SAMPLES = MEL_CACHE_FRAMES * SAMPLES_PER_FRAME


def crossfade_window(device: torch.device | str = "cpu") -> torch.Tensor:
    """The reference's float64 symmetric Hamming window of `2 * SOURCE_CACHE_SAMPLES` points."""
    return torch.from_numpy(np.hamming(2 * SOURCE_CACHE_SAMPLES)).to(device)


def crossfade(head: torch.Tensor, tail: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """`head` [1, N] with its first `len(window) / 2` samples blended into `tail` [1, >= that] (new tensor).

    Computed in the window's float64 and cast back, as the reference blends float32 audio with a
    float64 window.
    """
    return crossfade_rows(head, tail, window)


def crossfade_rows(head: torch.Tensor, tail: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """`crossfade` for a batch: row i of `head` [B, N] blended with row i of `tail` [B, >= overlap]."""
    overlap = window.shape[0] // 2
    if head.shape[-1] < overlap or tail.shape[-1] < overlap:
        raise ValueError(
            f"cross-fade needs {overlap} samples on both sides, got {head.shape[-1]} new and {tail.shape[-1]} cached"
        )
    if head.shape[0] != tail.shape[0]:
        raise ValueError(f"cross-fade: {head.shape[0]} rows of new audio but {tail.shape[0]} cached tails")
    out = head.clone()
    w = window.to(head.device)
    blended = head[..., :overlap].double() * w[:overlap] + tail[..., -overlap:].double() * w[overlap:]
    out[..., :overlap] = blended.to(head.dtype)
    return out


__all__ = [
    "MEL_CACHE_FRAMES",
    "SAMPLES_PER_FRAME",
    "SOURCE_CACHE_SAMPLES",
    "crossfade",
    "crossfade_rows",
    "crossfade_window",
]
