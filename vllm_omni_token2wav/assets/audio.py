# SPDX-License-Identifier: Apache-2.0
"""A real human speech recording shipped with the package, for tests and benchmarks.

Front-end parity tests need real speech (formants, pauses, onsets) rather than synthetic tones, and
tests may not download anything. The clip is CMU ARCTIC `arctic_a0007` (awb voice, 16 kHz, 4 s,
free to redistribute with its notice); source and licence are in README.md next to it.

It is read with `soundfile` (the bench extra) when installed, else with the standard library's `wave`
module: the clip is plain 16-bit PCM, so hosts with only the core dependencies (an accelerator host
running `benchmarks/device_check.py`) get the same samples.
"""

from __future__ import annotations

import wave
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
    try:
        import soundfile
    except ImportError:
        return read_pcm16_wav(speech_sample_path())
    samples, rate = soundfile.read(str(speech_sample_path()), dtype="float32", always_2d=False)
    return np.ascontiguousarray(samples, dtype=np.float32), int(rate)


def read_pcm16_wav(path: Path) -> tuple[np.ndarray, int]:
    """A mono 16-bit PCM WAV as (float32 samples / 32768, rate), with the standard library only."""
    with wave.open(str(path), "rb") as f:
        if f.getnchannels() != 1 or f.getsampwidth() != 2 or f.getcomptype() != "NONE":
            raise ValueError(
                f"{path}: expected mono 16-bit PCM, got {f.getnchannels()} channel(s), "
                f"{8 * f.getsampwidth()}-bit, compression {f.getcomptype()!r}; install soundfile to read it"
            )
        rate = f.getframerate()
        frames = f.readframes(f.getnframes())
    samples = np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0
    return samples, int(rate)
