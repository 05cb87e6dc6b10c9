# SPDX-License-Identifier: Apache-2.0
"""The prompt resampler keeps in-band tones and removes content above the new Nyquist frequency."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_omni_token2wav.model_executor.models.audio.resample import resample

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def _tone(freq: float, rate: int, seconds: float = 1.0, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _amplitude_at(x: np.ndarray, rate: int, freq: float) -> float:
    """Amplitude of the `freq` component by least squares on sin/cos (edges trimmed)."""
    x = np.asarray(x, dtype=np.float64)[rate // 10 : -rate // 10]
    t = (np.arange(len(x)) + rate // 10) / rate
    basis = np.stack([np.sin(2 * np.pi * freq * t), np.cos(2 * np.pi * freq * t)], axis=1)
    coef, *_ = np.linalg.lstsq(basis, x, rcond=None)
    return float(np.hypot(*coef))


def _rms_db(x: np.ndarray) -> float:
    return 10 * np.log10(np.mean(np.asarray(x, dtype=np.float64) ** 2) + 1e-30)


@pytest.mark.parametrize("freq", [100.0, 1000.0, 3000.0, 7000.0])
def test_in_band_tone_survives_44k1_to_16k_within_half_a_db(freq: float) -> None:
    out = resample(_tone(freq, 44100), 44100, 16000)
    assert out.dtype == np.float32 and len(out) == 16000
    error_db = 20 * np.log10(_amplitude_at(out, 16000, freq) / 0.5)
    assert abs(error_db) < 0.5, f"{freq} Hz: {error_db:+.3f} dB"


@pytest.mark.parametrize(
    ("orig", "target", "freq"), [(44100, 16000, 10000.0), (48000, 16000, 12000.0), (48000, 24000, 15000.0)]
)
def test_content_above_the_new_nyquist_is_attenuated_40_db(orig: int, target: int, freq: float) -> None:
    tone = _tone(freq, orig)
    out = resample(tone, orig, target)
    # A naive decimator would fold this tone to |freq - target| and keep its full level.
    attenuation = _rms_db(tone) - _rms_db(out[target // 10 : -target // 10])
    assert attenuation >= 40.0, f"{freq} Hz at {orig}->{target}: only {attenuation:.1f} dB"


def test_upsampling_16k_to_24k_keeps_a_tone() -> None:
    out = resample(_tone(1000.0, 16000), 16000, 24000)
    assert len(out) == 24000
    assert abs(20 * np.log10(_amplitude_at(out, 24000, 1000.0) / 0.5)) < 0.1


@pytest.mark.parametrize(
    ("orig", "target", "match"), [(0, 16000, "outside"), (16000, 10**7, "outside"), (16000.5, 16000, "whole")]
)
def test_bad_rates_raise_value_error(orig: float, target: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        resample(np.zeros(100, dtype=np.float32), orig, target)  # type: ignore[arg-type]
