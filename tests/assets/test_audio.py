# SPDX-License-Identifier: Apache-2.0
"""The shipped speech clip is real 16 kHz speech, unmodified, and declared as package data."""

from __future__ import annotations

import hashlib
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import pytest

from vllm_omni_token2wav.assets.audio import SPEECH_SAMPLE_SHA256, read_pcm16_wav, speech_sample, speech_sample_path

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

REPO = Path(__file__).resolve().parents[2]


def test_speech_sample_is_the_unmodified_cmu_arctic_clip() -> None:
    path = speech_sample_path()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SPEECH_SAMPLE_SHA256
    assert path.with_name("arctic_a0007_COPYING.txt").is_file(), "the CMU ARCTIC notice must ship with the clip"


def test_speech_sample_is_mono_float32_16k_with_speech_and_pauses() -> None:
    samples, rate = speech_sample()
    assert rate == 16000 and samples.dtype == np.float32 and samples.ndim == 1
    assert samples.shape[0] == 64000
    assert 0.3 < float(np.abs(samples).max()) <= 1.0
    # Speech alternates voiced segments and pauses: 20 ms frame energies span > 30 dB.
    frames = samples[: 64000 // 320 * 320].reshape(-1, 320)
    db = 10 * np.log10(np.mean(frames.astype(np.float64) ** 2, axis=1) + 1e-12)
    assert db.max() - np.percentile(db, 10) > 30


def test_without_soundfile_the_standard_library_reads_the_same_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    with_soundfile = speech_sample()
    monkeypatch.setitem(sys.modules, "soundfile", None)  # `import soundfile` now raises ImportError
    samples, rate = speech_sample()
    assert rate == with_soundfile[1] and samples.dtype == np.float32
    np.testing.assert_array_equal(samples, with_soundfile[0])
    # independent reference: the raw little-endian int16 payload after the 44-byte RIFF header
    raw = np.frombuffer(speech_sample_path().read_bytes()[44:], dtype="<i2")
    np.testing.assert_array_equal(samples, raw.astype(np.float32) / 32768.0)


def test_pcm16_reader_rejects_other_layouts(tmp_path: Path) -> None:
    import wave

    path = tmp_path / "stereo.wav"
    with wave.open(str(path), "wb") as f:
        f.setnchannels(2)
        f.setsampwidth(2)
        f.setframerate(16000)
        f.writeframes(b"\x00\x00" * 8)
    with pytest.raises(ValueError, match="expected mono 16-bit PCM, got 2 channel"):
        read_pcm16_wav(path)


def test_package_data_globs_ship_the_clip_and_its_notice() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = [g for patterns in config["tool"]["setuptools"]["package-data"].values() for g in patterns]
    for name in ("arctic_a0007.wav", "arctic_a0007_COPYING.txt"):
        assert any(fnmatch(name, g) for g in globs), f"{name} is not matched by package-data {globs}"
