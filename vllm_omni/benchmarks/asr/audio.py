# SPDX-License-Identifier: Apache-2.0
"""Read a generated wav as the mono float32 16 kHz signal every Whisper-family ASR expects.

Seed-TTS systems write 22.05/24/48 kHz files, sometimes stereo, sometimes int16; the ASR front ends all
assume 16 kHz mono float. soxr's "HQ" resampler is used (the quality the official pipeline gets from
librosa's default). Failures name the file so a report can list which outputs were unreadable.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ASR_SAMPLE_RATE = 16_000


class AudioReadError(ValueError):
    """A generated audio file exists but cannot be used (not decodable, empty, non-finite)."""


def to_mono_f32(
    samples: np.ndarray, rate: int, target_rate: int = ASR_SAMPLE_RATE, origin: str = "audio"
) -> np.ndarray:
    """Downmix (mean over channels) and resample `samples` ([n] or [n, channels]) to `target_rate`."""
    x = np.asarray(samples)
    if x.ndim == 2:
        x = x.mean(axis=1)
    elif x.ndim != 1:
        raise AudioReadError(f"{origin}: expected [samples] or [samples, channels], got shape {x.shape}")
    if np.issubdtype(x.dtype, np.integer):
        x = x.astype(np.float32) / float(np.iinfo(x.dtype).max + 1)
    x = x.astype(np.float32, copy=False)
    if x.size == 0:
        raise AudioReadError(f"{origin}: no samples")
    if not np.isfinite(x).all():
        raise AudioReadError(f"{origin}: contains NaN or Inf samples")
    if rate != target_rate:
        import soxr

        x = soxr.resample(x, rate, target_rate, quality="HQ").astype(np.float32, copy=False)
    return np.ascontiguousarray(x)


def read_audio_for_asr(path: str | Path, target_rate: int = ASR_SAMPLE_RATE) -> np.ndarray:
    """Mono float32 samples of `path` at `target_rate`; `AudioReadError` naming the file on any problem."""
    import soundfile as sf

    p = Path(path)
    try:
        samples, rate = sf.read(str(p), dtype="float32", always_2d=False)
    except (RuntimeError, sf.LibsndfileError, OSError) as exc:
        raise AudioReadError(f"{p}: cannot decode audio ({exc})") from exc
    return to_mono_f32(samples, int(rate), target_rate, origin=str(p))
