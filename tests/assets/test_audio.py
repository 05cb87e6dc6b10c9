# SPDX-License-Identifier: Apache-2.0
"""The shipped speech clip is real 16 kHz speech, unmodified, and declared as package data."""

from __future__ import annotations

import hashlib
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import pytest

from vllm_omni.assets.audio import SPEECH_SAMPLE_SHA256, speech_sample, speech_sample_path

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


def test_package_data_globs_ship_the_clip_and_its_notice() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = [g for patterns in config["tool"]["setuptools"]["package-data"].values() for g in patterns]
    for name in ("arctic_a0007.wav", "arctic_a0007_COPYING.txt"):
        assert any(fnmatch(name, g) for g in globs), f"{name} is not matched by package-data {globs}"
