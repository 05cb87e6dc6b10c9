# SPDX-License-Identifier: Apache-2.0
"""The fbank geometry of the CAM++ speaker-model input, which the prompt loader checks audio against.

The prompt loader (`loading.py`) refuses reference audio too short for a speaker embedding before
anything runs, so the sample rate, the 80-bin Kaldi options and the smallest frame count live at
this layer; the features themselves (`speaker_features`) are the speaker embedding's
(`speaker_embedding/features.py`), one layer up.
"""

from __future__ import annotations

from vllm_omni_token2wav.model_executor.models.audio.kaldi_fbank import FbankOptions

SPEAKER_SAMPLE_RATE = 16000
SPEAKER_NUM_MEL_BINS = 80
# CAM++ stats pooling needs T' = ceil(T / 2) >= 2 frames after the stride-2 TDNN, i.e. T >= 3;
# the TensorRT profiles upstream start at T = 4, so 4 is the smallest input every backend accepts.
MIN_SPEAKER_FRAMES = 4


def speaker_fbank_options() -> FbankOptions:
    """Kaldi fbank options of the CAM++ input: 80 bins of 16 kHz audio, dither 0, otherwise Kaldi defaults."""
    return FbankOptions(
        sample_frequency=float(SPEAKER_SAMPLE_RATE),
        num_mel_bins=SPEAKER_NUM_MEL_BINS,
        frame_length=25.0,
        frame_shift=10.0,
        dither=0.0,
        preemphasis_coefficient=0.97,
        remove_dc_offset=True,
        window_type="povey",
        blackman_coeff=0.42,
        round_to_power_of_two=True,
        snip_edges=True,
        low_freq=20.0,
        high_freq=0.0,
        use_log_fbank=True,
        use_power=True,
        use_energy=False,
        raw_energy=True,
        htk_compat=False,
        energy_floor=0.0,
    )


def min_speaker_samples(min_frames: int = MIN_SPEAKER_FRAMES) -> int:
    """Samples at 16 kHz needed for `min_frames` fbank frames (880 = 55 ms for the default 4)."""
    return speaker_fbank_options().min_samples(min_frames)


__all__ = [
    "MIN_SPEAKER_FRAMES",
    "SPEAKER_NUM_MEL_BINS",
    "SPEAKER_SAMPLE_RATE",
    "min_speaker_samples",
    "speaker_fbank_options",
]
