# SPDX-License-Identifier: Apache-2.0
"""CAM++'s poolings over the valid frames of a call: CAM context and statistics pooling.

Both CAM++ forms (the module tree in `dtdnn`, the folded serving form in `inference`) use these
for padded calls; the folded form for unpadded ones too, so that a padded and an unpadded call
run the very same reductions, the padded one over extra frames that hold exact zeros. With T' the
valid frames of a row and z zero on padded frames:

- CAM context of segment k: `sum_t z / T' + sum_{t in k} z / divisor_k`, the utterance mean plus
  the 100-frame segment mean (`divisor_k` per seg-pool mode, see `campplus.segpool` and
  `FrameInfo`); the utterance sum is the sum of the segment sums, and with one segment the two
  terms are one sum times `1/T' + 1/divisor`.
- statistics: mean `sum_t x / T'` and unbiased std `sqrt(sum_t (x - mean)^2 / (T' - 1))` (two
  passes, no epsilon, like `Tensor.std`).

**Accumulation dtype.** torch's CPU sum kernels group terms by the length of the reduced axis
(vectorised unrolling with a length-dependent tail), so in fp32 the sum of T' values and the sum
of the same values followed by zeros can differ in the last bits (measured up to 7e-7 on the
embedding). Accumulating in float64 (`acc_dtype`, the CPU choice of `CampplusInference`, with the
`FrameInfo` factors in float64 too) makes the rounded fp32 result independent of the grouping and
of how the formula is arranged; accelerators accumulate in fp32, where a padded call agrees to the
device's tolerance instead.

`dim` names the time axis: 1 for the folded form's time-major [B, T', C], 2 for the module tree's
channel-major [B, C, T'].
"""

from __future__ import annotations

import torch

from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.masking import FrameInfo
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.segpool import SEG_LEN

Tensor = torch.Tensor


def segment_sums(x: Tensor, dim: int, segments: int, acc_dtype: torch.dtype | None = None) -> Tensor:
    """Sums of consecutive 100-frame windows of `x` along `dim` (the last one partial): T' -> `segments`."""
    if segments == 1:
        return x.sum(dim=dim, keepdim=True, dtype=acc_dtype)
    frames = x.shape[dim]
    full = min(segments, frames // SEG_LEN)
    shape = list(x.shape)
    shape[dim : dim + 1] = [full, SEG_LEN]
    parts = [x.narrow(dim, 0, full * SEG_LEN).reshape(shape).sum(dim=dim + 1, dtype=acc_dtype)]
    if full < segments:  # the partial last window
        parts.append(x.narrow(dim, full * SEG_LEN, frames - full * SEG_LEN).sum(dim=dim, keepdim=True, dtype=acc_dtype))
    return torch.cat(parts, dim=dim)


def _along(t: Tensor, dim: int) -> Tensor:
    # FrameInfo stores per-segment factors as [B, nseg, 1] (time-major); move the segment axis to `dim`.
    return t if dim == 1 else t.transpose(1, dim)


def cam_context(
    z: Tensor, info: FrameInfo, dim: int, acc_dtype: torch.dtype | None = None, out: Tensor | None = None
) -> Tensor:
    """Per-segment context of a CAM layer, `z` zero on padded frames: [B, nseg, C] for dim=1, in z's dtype.

    Written into `out` when given (shape of the result, z's dtype). With one segment the two means
    are one sum times `inv_single`; in float64 accumulation that rounds to the same fp32 value as
    the two-term formula a padded call with more segments uses.
    """
    seg = segment_sums(z, dim, info.segments, acc_dtype)
    if out is None:
        out = torch.empty(seg.shape, dtype=z.dtype, device=z.device)
    if info.inv_single is not None:
        return torch.mul(seg, info.inv_single, out=out)
    total = seg.sum(dim=dim, keepdim=True)
    return torch.addcmul(total * _along(info.inv_count, dim), seg, _along(info.inv_segment, dim), out=out)


def frames_of_segments(values: Tensor, dim: int, frames: int) -> Tensor:
    """Repeat each segment's value over its 100 frames along `dim` and cut to `frames` (static shape)."""
    segments = values.shape[dim]
    if segments == 1:
        return values
    shape = list(values.shape)
    expanded = values.unsqueeze(dim + 1).expand(*shape[: dim + 1], SEG_LEN, *shape[dim + 1 :])
    shape[dim] = segments * SEG_LEN
    return expanded.reshape(shape).narrow(dim, 0, frames)


def statistics(
    x: Tensor, info: FrameInfo, mask: Tensor | None, dim: int, acc_dtype: torch.dtype | None = None
) -> Tensor:
    """concat(mean, unbiased std) over the valid frames along `dim`: [B, T', C] -> [B, 2C] for dim=1.

    `mask` is the frame mask laid out like `x` (broadcastable), None when every frame is valid.
    """
    xm = x if mask is None else x * mask
    mean = xm.sum(dim=dim, keepdim=True, dtype=acc_dtype).mul_(info.inv_count)
    centred = x - mean.to(x.dtype)
    if mask is not None:
        centred.mul_(mask)
    var = centred.square_().sum(dim=dim, keepdim=True, dtype=acc_dtype).mul_(info.inv_count_unbiased)
    return torch.cat((mean.squeeze(dim), var.sqrt_().squeeze(dim)), dim=-1).to(x.dtype)


__all__ = ["cam_context", "frames_of_segments", "segment_sums", "statistics"]
