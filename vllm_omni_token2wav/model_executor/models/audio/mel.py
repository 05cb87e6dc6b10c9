# SPDX-License-Identifier: Apache-2.0
"""The 24 kHz prompt log-mel spectrogram the flow model is conditioned on, in torch on any device.

The flow model of CosyVoice2/3 and Step-Audio2's token2wav was trained on Matcha-TTS style features
of the 24 kHz prompt (feat_extractor: n_fft 1920, hop 480, win 1920, 80 mels, fmin 0, fmax 8000,
center False), so a prompt mel must reproduce that recipe exactly. For a waveform x of N samples:

1. reflect-pad (n_fft - hop) / 2 = 720 samples on both sides (torch "reflect": x[-i] = x[i], the edge
   sample is not repeated), which makes T = N // hop frames (50 per second at 24 kHz);
2. frame t = padded[t*hop : t*hop + n_fft] times the periodic Hann window w(n) = 0.5 - 0.5 cos(2 pi n / win);
3. |X_k| = sqrt(Re^2 + Im^2 + 1e-9) of the n_fft-point DFT, k = 0 .. n_fft / 2;
4. M = B |X| with B the Slaney mel filter bank: mel(f) = 3 f / 200 below 1 kHz, 15 + 27 ln(f / 1000) /
   ln(6.4) above; n_mels + 2 corner frequencies equally spaced in mel between fmin and fmax; triangle
   weights over the FFT bin frequencies k sr / n_fft, each scaled by 2 / (f_{m+2} - f_m) (area
   normalisation, librosa's norm="slaney", htk=False);
5. log(max(M, 1e-5)); output [B, T, n_mels] (time major, as the flow model consumes it).

Validated in tests/model_executor/models/audio/test_mel.py against an independent reference: librosa's
`filters.mel` (Slaney) and a float64 numpy STFT; measured agreement in docs/design/audio_frontend.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vllm_omni_token2wav.model_executor.models.audio.constants_cache import device_constant
from vllm_omni_token2wav.model_executor.models.audio.dft import DFT_IMPLS, DftImpl, default_dft_impl, power_spectrum

PROMPT_MEL_SAMPLE_RATE = 24000
LOG_CLAMP = 1e-5
MAGNITUDE_EPS = 1e-9
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class MelConfig:
    """STFT + Slaney mel parameters (the defaults are the flow model's prompt feature extractor)."""

    sample_rate: int = PROMPT_MEL_SAMPLE_RATE
    n_fft: int = 1920
    hop_length: int = 480
    win_length: int = 1920
    n_mels: int = 80
    fmin: float = 0.0
    fmax: float = 8000.0

    @property
    def pad(self) -> int:
        return (self.n_fft - self.hop_length) // 2

    def validate(self) -> None:
        if not (0 < self.hop_length <= self.n_fft and 0 < self.win_length <= self.n_fft and self.n_mels > 0):
            raise ValueError(
                f"MelConfig: need 0 < hop_length, win_length <= n_fft and n_mels > 0, got hop {self.hop_length}, "
                f"win {self.win_length}, n_fft {self.n_fft}, n_mels {self.n_mels}"
            )
        if not 0.0 <= self.fmin < self.fmax <= 0.5 * self.sample_rate:
            raise ValueError(
                f"MelConfig: need 0 <= fmin < fmax <= Nyquist ({0.5 * self.sample_rate:g} Hz), got fmin {self.fmin}, "
                f"fmax {self.fmax}"
            )


PROMPT_MEL_CONFIG = MelConfig()


def hz_to_slaney_mel(freq: torch.Tensor) -> torch.Tensor:
    """Slaney's Auditory Toolbox mel scale: linear (3/200 mel per Hz) below 1 kHz, logarithmic above."""
    linear = freq * (3.0 / 200.0)
    log_part = 15.0 + torch.log(torch.clamp(freq, min=1e-10) / 1000.0) * (27.0 / math.log(6.4))
    return torch.where(freq >= 1000.0, log_part, linear)


def slaney_mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
    """Inverse of `hz_to_slaney_mel`."""
    linear = mel * (200.0 / 3.0)
    log_part = 1000.0 * torch.exp((mel - 15.0) * (math.log(6.4) / 27.0))
    return torch.where(mel >= 15.0, log_part, linear)


def slaney_mel_filters(cfg: MelConfig) -> torch.Tensor:
    """Area-normalised Slaney triangles, float64 [n_mels, n_fft // 2 + 1]."""
    edges_mel = torch.linspace(
        float(hz_to_slaney_mel(torch.tensor(cfg.fmin, dtype=torch.float64))),
        float(hz_to_slaney_mel(torch.tensor(cfg.fmax, dtype=torch.float64))),
        cfg.n_mels + 2,
        dtype=torch.float64,
    )
    edges = slaney_mel_to_hz(edges_mel)
    bin_freqs = torch.arange(cfg.n_fft // 2 + 1, dtype=torch.float64) * (cfg.sample_rate / cfg.n_fft)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bin_freqs[None, :] - lower) / (centre - lower)
    falling = (upper - bin_freqs[None, :]) / (upper - centre)
    triangles = torch.clamp(torch.minimum(rising, falling), min=0.0)
    return triangles * (2.0 / (upper - lower))


def _filters_and_bins(cfg: MelConfig, device: torch.device) -> tuple[torch.Tensor, int]:
    """Device copy of the filters transposed to [num_bins, n_mels], cut after the last non-zero FFT bin.

    Every triangle ends at or below fmax and weighs 0 at its upper corner, so only bins with frequency
    k sr / n_fft < fmax can be non-zero: num_bins = ceil(fmax n_fft / sr) (640 of 961 for the prompt mel).
    """
    num_bins = min(cfg.n_fft // 2 + 1, max(1, math.ceil(cfg.fmax * cfg.n_fft / cfg.sample_rate)))
    filters = device_constant(
        "slaney_mel", (cfg, num_bins), device, lambda: slaney_mel_filters(cfg)[:, :num_bins].T.contiguous()
    )
    return filters, num_bins


def _hann(win_length: int) -> torch.Tensor:
    n = torch.arange(win_length, dtype=torch.float64)
    return 0.5 - 0.5 * torch.cos(2.0 * math.pi * n / win_length)


def log_mel_spectrogram(
    waveform: torch.Tensor,
    cfg: MelConfig = PROMPT_MEL_CONFIG,
    *,
    check_finite: bool | None = None,
    dft_impl: DftImpl | None = None,
) -> torch.Tensor:
    """Log Slaney mel of `waveform` [N] or [B, N] per the module docstring: float32 [1 or B, T, n_mels].

    Raises:
        ValueError: non-float / wrong-rank / empty input, a waveform not longer than the reflect pad
            (pad + 1 samples needed), NaN/Inf (checked on CPU tensors by default, see `kaldi_fbank`).
    """
    cfg.validate()
    impl: DftImpl = default_dft_impl() if dft_impl is None else dft_impl
    if impl not in DFT_IMPLS:
        raise ValueError(f"log_mel_spectrogram: dft_impl must be one of {DFT_IMPLS}, got {dft_impl!r}")
    if not isinstance(waveform, torch.Tensor):
        raise ValueError(f"log_mel_spectrogram: waveform must be a torch.Tensor, got {type(waveform).__name__}")
    if waveform.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"log_mel_spectrogram: waveform must be a float tensor in [-1, 1], got dtype {waveform.dtype}")
    if waveform.ndim not in (1, 2):
        raise ValueError(f"log_mel_spectrogram: waveform must be [N] or [B, N], got shape {tuple(waveform.shape)}")
    x = waveform.to(torch.float32)
    if x.ndim == 1:
        x = x.unsqueeze(0)
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"log_mel_spectrogram: waveform is empty (shape {tuple(waveform.shape)})")
    num_samples = x.shape[1]
    if num_samples <= cfg.pad:
        raise ValueError(
            f"log_mel_spectrogram: {num_samples} samples ({1000.0 * num_samples / cfg.sample_rate:.1f} ms at "
            f"{cfg.sample_rate} Hz) is too short; the reflect padding needs > {cfg.pad} samples "
            f"({1000.0 * (cfg.pad + 1) / cfg.sample_rate:.1f} ms)"
        )
    do_check = x.device.type == "cpu" if check_finite is None else check_finite
    if do_check and not bool(torch.isfinite(x).all()):
        raise ValueError("log_mel_spectrogram: waveform contains NaN/Inf samples")

    padded = F.pad(x.unsqueeze(1), (cfg.pad, cfg.pad), mode="reflect").squeeze(1)
    frames = padded.unfold(-1, cfg.n_fft, cfg.hop_length)
    # win_length == n_fft for the prompt recipe; a shorter window is centred in the frame as torch.stft does.
    offset = (cfg.n_fft - cfg.win_length) // 2
    window = device_constant("hann_periodic", (cfg.win_length,), x.device, lambda: _hann(cfg.win_length))
    frames = frames[..., offset : offset + cfg.win_length] * window
    filters, num_bins = _filters_and_bins(cfg, x.device)
    # Zero samples before the window do not change |X_k|, only its phase: shift-invariance of the magnitude.
    magnitude = torch.sqrt(power_spectrum(frames, cfg.n_fft, num_bins, impl) + MAGNITUDE_EPS)
    return torch.matmul(magnitude, filters).clamp(min=LOG_CLAMP).log()


def prompt_mel_24k(
    waveform_24k: torch.Tensor, *, check_finite: bool | None = None, dft_impl: DftImpl | None = None
) -> torch.Tensor:
    """Flow-model prompt mel of a 24 kHz waveform in [-1, 1]: [1, T, 80] for [N], [B, T, 80] for [B, N].

    T = N // 480 (50 frames per second). See the module docstring for the exact formula.
    """
    return log_mel_spectrogram(waveform_24k, PROMPT_MEL_CONFIG, check_finite=check_finite, dft_impl=dft_impl)
