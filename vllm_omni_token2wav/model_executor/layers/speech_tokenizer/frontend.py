# SPDX-License-Identifier: Apache-2.0
"""Log-mel front end of the speech tokenizer v2, in torch so it runs on the serving device.

The shipped ONNX file starts at the log-mel; upstream computes it with a Whisper-style torch
routine on the host. This module computes the same features wherever the tensor lives:

    S = |STFT(x; n_fft 400, hop 160, periodic Hann(400), centred, reflect pad)|^2, last frame dropped
    M = F_slaney(128 x 201) @ S                      (librosa.filters.mel(sr=16000, n_fft=400, n_mels=128))
    L = log10(max(M, 1e-10));  L = max(L, max(L) - 8);  out = (L + 4) / 4

The Slaney filterbank (Slaney mel scale: linear below 1 kHz at 200/3 Hz per mel, logarithmic
above with step ln(6.4)/27; triangles normalised to unit area, 2 / (f[i+2] - f[i])) is computed
here in float64 and rounded to float32 the way librosa does.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.config import (
    HOP_LENGTH,
    N_FFT,
    N_MELS,
    SAMPLE_RATE,
)

_F_SP = 200.0 / 3.0
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOG_STEP = math.log(6.4) / 27.0


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    mel = hz / _F_SP
    above = hz >= _MIN_LOG_HZ
    mel[above] = _MIN_LOG_MEL + np.log(hz[above] / _MIN_LOG_HZ) / _LOG_STEP
    return mel


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    hz = mel * _F_SP
    above = mel >= _MIN_LOG_MEL
    hz[above] = _MIN_LOG_HZ * np.exp(_LOG_STEP * (mel[above] - _MIN_LOG_MEL))
    return hz


def slaney_mel_filters(
    sample_rate: int = SAMPLE_RATE,
    n_fft: int = N_FFT,
    n_mels: int = N_MELS,
    fmin: float = 0.0,
    fmax: float | None = None,
) -> np.ndarray:
    """[n_mels, n_fft // 2 + 1] float32 Slaney-normalised triangular filters (librosa's defaults)."""
    fmax = sample_rate / 2.0 if fmax is None else fmax
    fft_freqs = np.linspace(0.0, sample_rate / 2.0, 1 + n_fft // 2)
    mel_points = _mel_to_hz(np.linspace(_hz_to_mel(np.array([fmin]))[0], _hz_to_mel(np.array([fmax]))[0], n_mels + 2))
    widths = np.diff(mel_points)
    ramps = mel_points[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    # librosa stores the triangles in a float32 array first, then scales in place (float64 product
    # rounded back to float32): two roundings, reproduced here so the filters match bit for bit.
    weights = np.maximum(0.0, np.minimum(lower, upper)).astype(np.float32)
    enorm = 2.0 / (mel_points[2:] - mel_points[:-2])
    return (weights.astype(np.float64) * enorm[:, None]).astype(np.float32)


class LogMelFrontend(nn.Module):
    """16 kHz mono waveform [N] -> log-mel [128, N // 160] on the module's device."""

    window: torch.Tensor
    filters: torch.Tensor

    def __init__(self, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        # Non-persistent: derived constants, never part of a checkpoint.
        self.register_buffer("window", torch.hann_window(N_FFT, dtype=dtype, device="cpu"), persistent=False)
        self.register_buffer("filters", torch.from_numpy(slaney_mel_filters()).to(dtype), persistent=False)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        wav = wav.to(device=self.window.device, dtype=self.window.dtype)
        spec = torch.stft(
            wav, N_FFT, HOP_LENGTH, window=self.window, center=True, pad_mode="reflect", return_complex=True
        )
        power = spec[..., :-1].abs() ** 2
        mel = self.filters @ power
        log_spec = torch.clamp(mel, min=1e-10).log10()
        log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
        return (log_spec + 4.0) / 4.0
