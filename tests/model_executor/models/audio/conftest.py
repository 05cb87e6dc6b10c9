# SPDX-License-Identifier: Apache-2.0
"""Shared signals and the kaldi-native-fbank reference for the audio front-end tests."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from vllm_omni_token2wav.assets.audio import speech_sample


@pytest.fixture(scope="session")
def speech_16k() -> np.ndarray:
    """The shipped real speech clip (CMU ARCTIC, 16 kHz), float32 in [-1, 1]."""
    samples, rate = speech_sample()
    assert rate == 16000
    return samples


def knf_fbank(samples: np.ndarray, **options: Any) -> np.ndarray:
    """Features of kaldi-native-fbank (the C++ Kaldi reference) with kaldi_fbank-style option names."""
    knf = pytest.importorskip("kaldi_native_fbank")
    opts = knf.FbankOptions()
    frame = opts.frame_opts
    frame.samp_freq = float(options.get("sample_frequency", 16000.0))
    frame.frame_length_ms = float(options.get("frame_length", 25.0))
    frame.frame_shift_ms = float(options.get("frame_shift", 10.0))
    frame.dither = float(options.get("dither", 0.0))
    frame.preemph_coeff = float(options.get("preemphasis_coefficient", 0.97))
    frame.remove_dc_offset = bool(options.get("remove_dc_offset", True))
    frame.window_type = str(options.get("window_type", "povey"))
    frame.round_to_power_of_two = bool(options.get("round_to_power_of_two", True))
    frame.blackman_coeff = float(options.get("blackman_coeff", 0.42))
    frame.snip_edges = bool(options.get("snip_edges", True))
    opts.mel_opts.num_bins = int(options.get("num_mel_bins", 80))
    opts.mel_opts.low_freq = float(options.get("low_freq", 20.0))
    opts.mel_opts.high_freq = float(options.get("high_freq", 0.0))
    opts.use_energy = bool(options.get("use_energy", False))
    opts.raw_energy = bool(options.get("raw_energy", True))
    opts.htk_compat = bool(options.get("htk_compat", False))
    opts.energy_floor = float(options.get("energy_floor", 0.0))
    opts.use_log_fbank = bool(options.get("use_log_fbank", True))
    opts.use_power = bool(options.get("use_power", True))
    fbank = knf.OnlineFbank(opts)
    fbank.accept_waveform(frame.samp_freq, np.asarray(samples, dtype=np.float32).tolist())
    fbank.input_finished()
    return np.stack([np.asarray(fbank.get_frame(i)) for i in range(fbank.num_frames_ready)]).astype(np.float32)


def float64_kaldi_fbank(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log fbank, linear mel energies) in float64 numpy from Kaldi's formulas, default CAM++ options.

    Written from Kaldi's feature-window.cc / mel-computations.cc definitions, independently of the code
    under test: it tells how far each float32 implementation is from the exact value.
    """
    x = np.asarray(samples, dtype=np.float64)
    win, shift, fft = 400, 160, 512
    count = 1 + (len(x) - win) // shift
    frames = x[np.arange(count)[:, None] * shift + np.arange(win)[None, :]]
    frames = frames - frames.mean(axis=1, keepdims=True)
    frames = np.concatenate([frames[:, :1] * (1 - 0.97), frames[:, 1:] - 0.97 * frames[:, :-1]], axis=1)
    frames = frames * (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(win) / (win - 1))) ** 0.85
    spec = np.fft.rfft(frames, n=fft, axis=1)[:, : fft // 2]
    power = spec.real**2 + spec.imag**2

    def mel(f: np.ndarray | float) -> np.ndarray:
        return 1127.0 * np.log(1.0 + np.asarray(f) / 700.0)

    lo, hi, bins = mel(20.0), mel(8000.0), 80
    delta = (hi - lo) / (bins + 1)
    fft_mel = mel(np.arange(fft // 2) * 16000.0 / fft)
    banks = np.zeros((bins, fft // 2))
    for m in range(bins):
        left, centre, right = lo + m * delta, lo + (m + 1) * delta, lo + (m + 2) * delta
        up = (fft_mel > left) & (fft_mel <= centre)
        down = (fft_mel > centre) & (fft_mel < right)
        banks[m, up] = (fft_mel[up] - left) / (centre - left)
        banks[m, down] = (right - fft_mel[down]) / (right - centre)
    energies = power @ banks.T
    return np.log(np.maximum(energies, np.finfo(np.float32).eps)), energies
