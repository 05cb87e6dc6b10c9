# SPDX-License-Identifier: Apache-2.0
"""The CAM++ speaker-model input: Kaldi fbank minus its per-utterance mean, on the waveform's device.

CosyVoice / Step-Audio2 front ends feed campplus.onnx with 80-bin Kaldi fbank of the 16 kHz prompt
(dither 0, otherwise Kaldi defaults) after subtracting the mean over time of each utterance. Doing it
here, on the device, removes the CPU fbank + host-to-device copy that upstream still has. The fbank
geometry (rate, bins, smallest frame count) is `audio/speaker_fbank.py`'s: the prompt loader checks it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vllm_omni_token2wav.model_executor.models.audio.kaldi_fbank import host_lengths, kaldi_fbank
from vllm_omni_token2wav.model_executor.models.audio.speaker_fbank import (
    MIN_SPEAKER_FRAMES,
    SPEAKER_SAMPLE_RATE,
    speaker_fbank_options,
)


def speaker_features(
    waveform_16k: torch.Tensor,
    lengths: Sequence[int] | torch.Tensor | None = None,
    *,
    min_frames: int = MIN_SPEAKER_FRAMES,
    check_finite: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """CAM++ input features: f[t] - mean_t f[t], f = kaldi_fbank(80 bins, dither 0, 16 kHz).

    Args:
        waveform_16k: [N] or [B, N] float waveform in [-1, 1] at 16 kHz on any device.
        lengths: per-item valid lengths of a padded [B, N] batch (host ints or CPU tensor); the mean
            is then taken over each item's own frames only.
        min_frames: smallest accepted frame count (CAM++ needs >= 4; see MIN_SPEAKER_FRAMES).
        check_finite: as in `kaldi_fbank` (None: check on CPU only, no device sync).

    Returns:
        float32 [T, 80] for [N] input (add `[None]` for the model's [1, T, 80]), [B, T, 80] for
        [B, N]; with `lengths` a tuple (features with zeroed padding frames, frame_counts [B] int64 CPU).

    Raises:
        ValueError: everything `kaldi_fbank` rejects, and audio giving fewer than `min_frames` frames.
    """
    opts = speaker_fbank_options()
    if isinstance(waveform_16k, torch.Tensor) and waveform_16k.ndim in (1, 2) and waveform_16k.shape[-1] > 0:
        batch = waveform_16k.shape[0] if waveform_16k.ndim == 2 else 1
        n = waveform_16k.shape[-1]
        # Host ints only: the length checks never read device memory.
        items = [n] * batch if lengths is None else host_lengths(lengths, batch, n)
        lengths = None if lengths is None else items
        short = [i for i, m in enumerate(items) if opts.num_frames(m) < min_frames]
        if short:
            i = short[0]
            m = items[i]
            need = opts.min_samples(min_frames)
            need_ms = 1000.0 * need / SPEAKER_SAMPLE_RATE
            raise ValueError(
                f"speaker_features: {'item ' + str(i) + ' has ' if lengths is not None else ''}{m} samples "
                f"({1000.0 * m / SPEAKER_SAMPLE_RATE:.1f} ms at 16 kHz) give {opts.num_frames(m)} fbank frame(s); "
                f"the speaker model needs >= {min_frames} ({need} samples, {need_ms:.0f} ms)"
            )
    result = kaldi_fbank(
        waveform_16k,
        sample_frequency=opts.sample_frequency,
        num_mel_bins=opts.num_mel_bins,
        dither=0.0,
        lengths=lengths,
        check_finite=check_finite,
    )
    if not isinstance(result, tuple):
        return result - result.mean(dim=-2, keepdim=True)
    feats, counts = result
    # Padding frames are zero, so the sum over all frames is the sum over the valid ones.
    batch_feats = feats if feats.ndim == 3 else feats.unsqueeze(0)
    denom = counts.to(device=feats.device, dtype=feats.dtype)
    mean = batch_feats.sum(dim=1, keepdim=True) / denom[:, None, None]
    valid = torch.arange(batch_feats.shape[1], device=feats.device)[None, :] < counts.to(feats.device)[:, None]
    zero = torch.zeros((), dtype=feats.dtype, device=feats.device)
    centred = torch.where(valid.unsqueeze(-1), batch_feats - mean, zero)
    return (centred if feats.ndim == 3 else centred[0]), counts


__all__ = ["speaker_features"]
