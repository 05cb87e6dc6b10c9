# SPDX-License-Identifier: Apache-2.0
"""Band-limited sample-rate conversion of prompt audio (host side, before the device front end).

Prompts arrive at any rate (44.1/48 kHz recordings, 8 kHz telephone audio) and the front end needs
16 kHz (fbank, speech tokens) and 24 kHz (flow prompt mel), each converted from the original audio.
Naive decimation or linear interpolation aliases everything above the new Nyquist frequency back into
the band the speaker model listens to, so conversion goes through libsoxr (python-soxr): a linear-phase
polyphase / FFT resampler with a designed anti-aliasing low-pass. Quality "HQ" (libsoxr's default,
20-bit precision) is used; tests/model_executor/models/audio/test_resample.py checks that a 1 kHz tone
survives 44.1 kHz -> 16 kHz within 0.5 dB and that a tone above the new Nyquist is attenuated >= 40 dB
(measured values in docs/design/audio_frontend.md).
"""

from __future__ import annotations

import numpy as np

from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

# Below 4 kHz there is no usable speech band; above 384 kHz no audio interface records.
MIN_SAMPLE_RATE = 4000
MAX_SAMPLE_RATE = 384000
SOXR_QUALITY = "HQ"


def check_sample_rate(rate: object, what: str) -> int:
    """`rate` as an int when it is a plausible audio sample rate, else ValueError naming `what`."""
    if isinstance(rate, bool) or not isinstance(rate, int | float | np.integer | np.floating):
        raise ValueError(f"{what}: sample rate must be a number of Hz, got {type(rate).__name__} {rate!r}")
    if not np.isfinite(rate) or float(rate) != int(rate):
        raise ValueError(f"{what}: sample rate must be a whole number of Hz, got {rate!r}")
    value = int(rate)
    if not MIN_SAMPLE_RATE <= value <= MAX_SAMPLE_RATE:
        raise ValueError(
            f"{what}: sample rate {value} Hz is outside [{MIN_SAMPLE_RATE}, {MAX_SAMPLE_RATE}] Hz; "
            "is the rate passed in the right unit (Hz, not kHz) and position?"
        )
    return value


def resample(waveform: np.ndarray, orig_rate: int, target_rate: int) -> np.ndarray:
    """Mono float waveform [N] at `orig_rate` -> float32 [round(N * target / orig)] at `target_rate`."""
    orig = check_sample_rate(orig_rate, "resample (orig_rate)")
    target = check_sample_rate(target_rate, "resample (target_rate)")
    if waveform.ndim != 1:
        raise ValueError(f"resample: expected a mono [N] waveform, got shape {waveform.shape}")
    if orig == target:
        return waveform.astype(np.float32, copy=True)
    try:
        import soxr
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "resampling prompt audio needs python-soxr: pip install 'vllm-omni-token2wav[bench]' (or pip install soxr)"
        ) from exc
    out = soxr.resample(np.ascontiguousarray(waveform, dtype=np.float64), orig, target, quality=SOXR_QUALITY)
    return np.asarray(out, dtype=np.float32)
