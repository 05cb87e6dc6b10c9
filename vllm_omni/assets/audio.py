# SPDX-License-Identifier: Apache-2.0
"""A real human speech recording shipped with the package, for tests and benchmarks.

Front-end parity tests need real speech (formants, pauses, onsets) rather than synthetic tones, and
tests may not download anything. The clip is CMU ARCTIC `arctic_a0007` (awb voice, 16 kHz, 4 s,
free to redistribute with its notice); source and licence are in README.md next to it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SPEECH_SAMPLE_NAME = "arctic_a0007.wav"
SPEECH_SAMPLE_RATE = 16000
SPEECH_SAMPLE_SHA256 = "1b850392f8c87ee2efe5a686523f1bab61d2a38d59bc43d1127e17e406f9e57d"


def speech_sample_path() -> Path:
    """Path of the shipped 16 kHz mono 16-bit WAV."""
    path = Path(__file__).with_name(SPEECH_SAMPLE_NAME)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: the shipped speech sample is missing; the package data was not installed "
            "(check [tool.setuptools.package-data] in pyproject.toml)"
        )
    return path


def speech_sample() -> tuple[np.ndarray, int]:
    """(float32 mono waveform in [-1, 1], native sample rate) of the shipped speech clip."""
    import soundfile

    samples, rate = soundfile.read(str(speech_sample_path()), dtype="float32", always_2d=False)
    return np.ascontiguousarray(samples, dtype=np.float32), int(rate)
