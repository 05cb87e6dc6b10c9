# SPDX-License-Identifier: Apache-2.0
"""prompt_mel_24k against an independent reference: librosa's Slaney filters and a float64 numpy STFT."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_omni_token2wav.model_executor.models.audio import (
    PROMPT_MEL_CONFIG,
    MelConfig,
    log_mel_spectrogram,
    prompt_mel_24k,
)
from vllm_omni_token2wav.model_executor.models.audio.mel import slaney_mel_filters
from vllm_omni_token2wav.model_executor.models.audio.resample import resample

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

MAX_ABS_LIMIT = 1e-4


def _reference_mel(samples: np.ndarray, cfg: MelConfig = PROMPT_MEL_CONFIG) -> np.ndarray:
    """The CosyVoice / Matcha-TTS recipe in float64 numpy: reflect pad, periodic Hann, |STFT|, Slaney mel, log."""
    librosa = pytest.importorskip("librosa")
    basis = librosa.filters.mel(
        sr=cfg.sample_rate, n_fft=cfg.n_fft, n_mels=cfg.n_mels, fmin=cfg.fmin, fmax=cfg.fmax, dtype=np.float64
    )
    x = np.pad(np.asarray(samples, dtype=np.float64), (cfg.pad, cfg.pad), mode="reflect")
    count = 1 + (len(x) - cfg.n_fft) // cfg.hop_length
    frames = x[np.arange(count)[:, None] * cfg.hop_length + np.arange(cfg.n_fft)[None, :]]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(cfg.win_length) / cfg.win_length)
    spec = np.fft.rfft(frames * window, axis=1)
    magnitude = np.sqrt(spec.real**2 + spec.imag**2 + 1e-9)
    return np.log(np.maximum(magnitude @ basis.T, 1e-5))


def _tone(freq: float, seconds: float = 1.0, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * 24000)) / 24000
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


@pytest.fixture(scope="module")
def speech_24k(speech_16k: np.ndarray) -> np.ndarray:
    return resample(speech_16k, 16000, 24000)


def _signal(name: str, speech_24k: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(0)
    signals = {
        "speech": lambda: speech_24k,
        "white_noise": lambda: (0.1 * rng.standard_normal(24000)).astype(np.float32),
        "tone_1k": lambda: _tone(1000.0),
        "tone_7k": lambda: _tone(7000.0, amplitude=0.9),
        "silence": lambda: np.zeros(24000, dtype=np.float32),
        "clipped": lambda: np.clip(_tone(300.0, amplitude=5.0), -1, 1),
    }
    return signals[name]()


@pytest.mark.parametrize("dft_impl", ["fft", "matmul"])
@pytest.mark.parametrize("name", ["speech", "white_noise", "tone_1k", "tone_7k", "silence", "clipped"])
def test_prompt_mel_matches_librosa_filters_and_numpy_stft(name: str, dft_impl: str, speech_24k: np.ndarray) -> None:
    samples = _signal(name, speech_24k)
    ours = prompt_mel_24k(torch.from_numpy(samples), dft_impl=dft_impl)
    ref = _reference_mel(samples)
    assert ours.shape == (1, len(samples) // 480, 80) and ours.dtype == torch.float32
    diff = np.abs(ours[0].numpy() - ref)
    assert diff.max() <= MAX_ABS_LIMIT, f"{name}: max |diff| {diff.max():.3g}"


def test_slaney_filters_equal_librosa() -> None:
    librosa = pytest.importorskip("librosa")
    ref = librosa.filters.mel(sr=24000, n_fft=1920, n_mels=80, fmin=0, fmax=8000, dtype=np.float64)
    np.testing.assert_allclose(slaney_mel_filters(PROMPT_MEL_CONFIG).numpy(), ref, rtol=1e-10, atol=1e-14)


def test_frame_rate_is_50_per_second_for_any_length() -> None:
    for n in (721, 959, 960, 961, 24000, 24479):
        assert prompt_mel_24k(torch.zeros(n)).shape == (1, n // 480, 80)


def test_batched_mel_equals_each_item(speech_24k: np.ndarray) -> None:
    batch = torch.from_numpy(np.stack([speech_24k[:24000], speech_24k[24000:48000]]))
    ours = prompt_mel_24k(batch)
    assert ours.shape == (2, 50, 80)
    for i in range(2):
        torch.testing.assert_close(ours[i], prompt_mel_24k(batch[i])[0], atol=1e-5, rtol=0)


def test_other_configs_follow_the_same_recipe(speech_24k: np.ndarray) -> None:
    cfg = MelConfig(sample_rate=24000, n_fft=1024, hop_length=256, win_length=1024, n_mels=100, fmin=0.0, fmax=12000.0)
    # Add a noise floor: the clip came from 16 kHz audio, so its 8-12 kHz band is empty otherwise.
    noisy = speech_24k + (1e-3 * np.random.default_rng(1).standard_normal(len(speech_24k))).astype(np.float32)
    ours = log_mel_spectrogram(torch.from_numpy(noisy), cfg)
    ref = _reference_mel(noisy, cfg)
    assert np.abs(ours[0].numpy() - ref).max() <= MAX_ABS_LIMIT


@pytest.mark.parametrize(
    ("waveform", "match"),
    [
        (torch.zeros(720), r"720 samples .* needs > 720"),
        (torch.zeros(0), "empty"),
        (torch.zeros(24000, dtype=torch.int16), "float tensor"),
        (torch.zeros(1, 1, 24000), r"\[N\] or \[B, N\]"),
        (torch.full((24000,), float("nan")), "NaN/Inf"),
        ([0.0] * 24000, "torch.Tensor"),
    ],
)
def test_bad_prompt_mel_inputs_raise_value_error(waveform: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        prompt_mel_24k(waveform)  # type: ignore[arg-type]


def test_bad_mel_config_raises_value_error() -> None:
    with pytest.raises(ValueError, match="fmax"):
        log_mel_spectrogram(torch.zeros(24000), MelConfig(fmax=13000.0))
