# SPDX-License-Identifier: Apache-2.0
"""Long-audio windowing of the speech tokenizer v2, shared by the torch and onnxruntime backends.

The encoder is trained on <= 30 s and its RoPE tables stop at 2048 positions, so longer audio is
tokenised in windows, the way the reference s3tokenizer does it:

- the log-mel is computed once over the whole utterance (the max - 8 floor is global);
- windows of 3000 frames (30 s) start every 2600 frames (4 s overlap) while start < T, the last
  one possibly short (the reference zero-pads it to 3000 and masks; the masked model gives the
  same tokens as the unpadded window, which is what is run here);
- each window is tokenised on its own, then concatenated dropping 50 tokens (2 s) on each side of
  every join: window i contributes tokens[50 if i > 0 else 0 : -50 if i < last else len].

Audio of <= 3000 frames is a single window and goes through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.config import (
    JOIN_DROP_TOKENS,
    STRIDE_FRAMES,
    WINDOW_FRAMES,
)

# One window mel [1, 128, t] (t <= 3000) -> its codes [L] (int64, on any device).
WindowQuantizer = Callable[[torch.Tensor], torch.Tensor]


def window_starts(num_frames: int) -> list[int]:
    """Start frames of the windows for a `num_frames` mel (a single 0 when it fits one window)."""
    if num_frames <= WINDOW_FRAMES:
        return [0]
    return list(range(0, num_frames, STRIDE_FRAMES))


def merge_window_tokens(windows: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate per-window codes, dropping JOIN_DROP_TOKENS on each side of every join."""
    if len(windows) == 1:
        return windows[0]
    pieces = []
    last = len(windows) - 1
    for i, codes in enumerate(windows):
        start = 0 if i == 0 else JOIN_DROP_TOKENS
        stop = codes.shape[0] - JOIN_DROP_TOKENS if i < last else codes.shape[0]
        pieces.append(codes[start:stop])
    return torch.cat(pieces)


def quantize_long_mel(mel: torch.Tensor, quantize_window: WindowQuantizer) -> torch.Tensor:
    """mel [128, T] -> codes [L] (int64), windowing audio longer than 30 s."""
    num_frames = mel.shape[-1]
    windows = [quantize_window(mel[None, :, s : s + WINDOW_FRAMES]) for s in window_starts(num_frames)]
    return merge_window_tokens([w.to(torch.int64).reshape(-1) for w in windows])
