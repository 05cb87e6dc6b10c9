# SPDX-License-Identifier: Apache-2.0
"""Which frames of a padded CAM++ call are real: masks, counts and segment divisors from `lengths`.

Accelerators replay captured graphs per shape bucket, and batched calls stack utterances of
different lengths, so CAM++ runs on features padded from T to Tb frames plus a `lengths` tensor
[B]. The embedding of a padded row must equal the embedding of that row run alone, unpadded.
Every place where CAM++ mixes frames must therefore see what the unpadded call sees:

| where frames mix                           | the unpadded call sees          | a padded call                      |
|--------------------------------------------|---------------------------------|------------------------------------|
| head 3x3 convs, the k5/s2 TDNN, the dilated| zeros beyond its last frame     | multiplies the conv input by the   |
| 3-tap CAM local convs                      | (the convs' zero padding)       | frame mask first: folded biases,   |
|                                            |                                 | BN and ReLU make padded frames     |
|                                            |                                 | non-zero                           |
| CAM context, utterance mean                | mean over its T' frames         | masked sum x 1 / T'_valid          |
| CAM context, 100-frame segment means       | legacy: last segment zero-padded| masked sum per segment x 1 /       |
|                                            | to 100, / 100; exact: / its n   | divisor computed from `lengths`    |
| statistics pooling                         | mean, unbiased std over T'      | masked sums x 1/T', 1/(T' - 1)     |
| the stride-2 TDNN                          | T' = ceil(T / 2) frames         | T'_valid = (lengths + 1) // 2      |

1x1 convs, BN and ReLU act on each frame alone, so padded frames may hold anything there.

`FrameInfo.padded(lengths, frames, mode)` derives all of it on `lengths.device` with tensor ops
only (no `.item()`, no shape that depends on the values), so a padded forward can be captured in
a CUDA / NPU graph once per (frame bucket, batch bucket) and replayed with new lengths.
`FrameInfo.dense(...)` is the bookkeeping of an unpadded call (no masks) built with the same
formulas, so a padded and an unpadded call divide by bit-identical tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.segpool import SEG_LEN

Tensor = torch.Tensor

#: Statistics pooling needs T' = ceil(T / 2) >= 2 valid frames (unbiased std); TensorRT profiles start at 4.
MIN_FRAMES = 4


def pooled_frames(frames: int) -> int:
    """Frames after the stride-2 TDNN (kernel 5, padding 2): ceil(T / 2)."""
    return (frames + 1) // 2


def segment_count(pooled: int) -> int:
    """100-frame segments of the CAM context at T' pooled frames (the last one may be partial)."""
    return -(-pooled // SEG_LEN)


@dataclass(frozen=True)
class FrameInfo:
    """Valid-frame bookkeeping of one CAM++ call over `batch` rows of `frames` (padded) frames.

    Masks are None for an unpadded call (every frame valid). All tensors live on the call's device;
    shapes depend only on `batch` and `frames`.
    """

    batch: int
    frames: int  # T, the (padded) input frames
    pooled: int  # T' = ceil(T / 2), frames of the dense blocks
    input_mask: Tensor | None  # [B, 1, 1, T] 1.0 / 0.0: the head's time axis is the last one
    pooled_mask: Tensor | None  # [B, 1, T'] 1.0 / 0.0 (channel-major; `.transpose(1, 2)` for time-major)
    # Pooling factors, in the accumulation dtype of the poolings (see `campplus.pooling`):
    inv_count: Tensor  # [B, 1, 1] 1 / T'_valid (utterance mean of the CAM context, statistics mean)
    inv_count_unbiased: Tensor  # [B, 1, 1] 1 / (T'_valid - 1) (unbiased variance)
    inv_segment: Tensor  # [B, nseg, 1] 1 / divisor of each 100-frame segment (seg-pool mode applied)
    inv_single: Tensor | None  # [B, 1, 1] inv_count + inv_segment when there is one segment, else None

    @property
    def segments(self) -> int:
        return self.inv_segment.shape[1]

    @property
    def masked(self) -> bool:
        return self.input_mask is not None

    @classmethod
    def dense(
        cls,
        batch: int,
        frames: int,
        mode: Literal["legacy", "exact"],
        device: torch.device,
        dtype: torch.dtype = torch.float32,
        acc_dtype: torch.dtype | None = None,
    ) -> FrameInfo:
        """An unpadded call: every one of the `frames` frames of every row is valid."""
        lengths = torch.full((batch,), frames, dtype=torch.int64, device=device)
        return cls._build(lengths, frames, mode, dtype, acc_dtype or dtype, masks=False)

    @classmethod
    def padded(
        cls,
        lengths: Tensor,
        frames: int,
        mode: Literal["legacy", "exact"],
        dtype: torch.dtype = torch.float32,
        acc_dtype: torch.dtype | None = None,
    ) -> FrameInfo:
        """A padded call: row b's valid input frames are [0, lengths[b]) of `frames`.

        `lengths` is an integer tensor [B] on the call's device. Its values are never read here (on
        an accelerator that would synchronise the host with the device, and inside a captured graph
        it is not allowed): callers check them where they build them (`check_lengths`). Masks get
        `dtype`, the pooling factors `acc_dtype` (default: `dtype`).
        """
        check_lengths(lengths, frames, values=False)
        return cls._build(lengths.to(torch.int64), frames, mode, dtype, acc_dtype or dtype, masks=True)

    @classmethod
    def _build(
        cls,
        lengths: Tensor,
        frames: int,
        mode: Literal["legacy", "exact"],
        dtype: torch.dtype,
        acc_dtype: torch.dtype,
        *,
        masks: bool,
    ) -> FrameInfo:
        device = lengths.device
        batch = lengths.shape[0]
        pooled = pooled_frames(frames)
        valid_pooled = (lengths + 1) // 2  # the stride-2 TDNN keeps ceil(L / 2) frames
        count = valid_pooled.to(acc_dtype).view(batch, 1, 1)
        nseg = segment_count(pooled)
        if mode == "legacy":
            # onnxruntime <= 1.28: every window divides by 100 (the partial one as if zero-padded).
            divisor = torch.full((batch, nseg, 1), float(SEG_LEN), dtype=acc_dtype, device=device)
        else:
            # Segment k holds min(100, T'_valid - 100 k) real frames; segments past the valid ones
            # only feed padded frames, so any positive divisor is fine there (1).
            start = torch.arange(nseg, device=device, dtype=torch.int64) * SEG_LEN
            divisor = (valid_pooled.view(batch, 1) - start).clamp(1, SEG_LEN).to(acc_dtype).view(batch, nseg, 1)
        inv_count, inv_segment = count.reciprocal(), divisor.reciprocal()
        input_mask = pooled_mask = None
        if masks:
            input_mask = (torch.arange(frames, device=device) < lengths.view(batch, 1)).to(dtype)
            input_mask = input_mask.view(batch, 1, 1, frames)
            pooled_mask = (torch.arange(pooled, device=device) < valid_pooled.view(batch, 1)).to(dtype)
            pooled_mask = pooled_mask.view(batch, 1, pooled)
        return cls(
            batch=batch,
            frames=frames,
            pooled=pooled,
            input_mask=input_mask,
            pooled_mask=pooled_mask,
            inv_count=inv_count,
            inv_count_unbiased=(count - 1).reciprocal(),
            inv_segment=inv_segment,
            inv_single=inv_count + inv_segment if nseg == 1 else None,
        )


def check_lengths(lengths: Tensor, frames: int, batch: int | None = None, *, values: bool = True) -> None:
    """Raise a ValueError unless `lengths` is an integer [B] tensor (B = `batch` if given) of valid frames.

    With `values`, MIN_FRAMES <= length <= frames is checked too, but only for CPU tensors: reading a
    device tensor would synchronise the host with the device. The padded forwards check shapes only
    (`values=False`): they are the bodies graphs capture, where no value may be read on the host.
    """
    if lengths.dim() != 1 or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise ValueError(
            f"lengths must be an integer tensor [B] of valid frames per row, got dtype {lengths.dtype} "
            f"and shape {list(lengths.shape)}"
        )
    if batch is not None and lengths.shape[0] != batch:
        raise ValueError(f"lengths has {lengths.shape[0]} entries but the features have {batch} rows")
    if values and lengths.device.type == "cpu" and lengths.numel():
        low, high = int(lengths.min()), int(lengths.max())
        if low < MIN_FRAMES or high > frames:
            raise ValueError(
                f"lengths must lie in [{MIN_FRAMES}, {frames}] (frames of the padded features), got "
                f"min {low} and max {high}; CAM++ needs >= {MIN_FRAMES} valid frames per row"
            )


def masked(x: Tensor, mask: Tensor | None) -> Tensor:
    """`x * mask` (a new tensor), or `x` itself when every frame is valid."""
    return x if mask is None else x * mask


def mask_(x: Tensor, mask: Tensor | None) -> Tensor:
    """Zero the padded frames of `x` in place (nothing to do when every frame is valid)."""
    return x if mask is None else x.mul_(mask)


__all__ = ["MIN_FRAMES", "FrameInfo", "check_lengths", "mask_", "masked", "pooled_frames", "segment_count"]
