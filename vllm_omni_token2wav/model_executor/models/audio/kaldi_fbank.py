# SPDX-License-Identifier: Apache-2.0
"""Kaldi-compatible log mel filter bank features in torch, on the waveform's own device.

Upstream computes the CAM++ input with `torchaudio.compliance.kaldi.fbank` on the CPU and copies the
features to the device; torchaudio cannot be loaded with this project's torch at all, and the host
work was the last CPU step of the speaker-embedding request path. This module reimplements Kaldi's
`compute-fbank-feats` (same option names, defaults and semantics) with tensor ops only: no Python loop
over frames, no host round trip, batched with per-item lengths.

Per frame (Kaldi `FeatureWindowFunction` / `ProcessWindow` / `MelBanks`), W = window samples,
P = padded FFT size, all in float32:

1. framing: W = int(fs * frame_length_ms / 1000), shift S likewise. snip_edges=True: frames t*S ..
   t*S+W-1 for t < 1 + (N - W) // S. snip_edges=False: (N + S // 2) // S frames starting at
   t*S + S//2 - W//2, samples outside [0, N) mirrored (x[-1 - i] = x[i], x[N + i] = x[N - 1 - i]).
2. dither: x += dither * n, n ~ N(0, 1) drawn per frame sample (from `generator` when given).
3. remove_dc_offset: x -= mean(x) (twice: the second pass removes the first mean's rounding error).
4. raw log energy (use_energy and raw_energy): log(max(sum x^2, FLT_EPSILON)).
5. pre-emphasis: x[i] -= c * x[i - 1] for i > 0, x[0] -= c * x[0].
6. window w(i), a = 2 pi / (W - 1): hanning 0.5 - 0.5 cos(a i); hamming 0.54 - 0.46 cos(a i);
   povey (0.5 - 0.5 cos(a i))^0.85; blackman b - 0.5 cos(a i) + (0.5 - b) cos(2 a i); rectangular 1.
7. zero-pad to P (next power of two when round_to_power_of_two, else W); |X_k|^2 for k < P/2
   (use_power) or |X_k|. The Nyquist bin is not used, as in Kaldi.
8. mel(f) = 1127 ln(1 + f / 700); bin m has mel corners l = mel(low) + m d, c = l + d, r = l + 2 d,
   d = (mel(high) - mel(low)) / (num_mel_bins + 1), high = fs/2 + high_freq when high_freq <= 0;
   weight of FFT bin k (frequency k fs / P, mel value u): (u - l)/(c - l) on (l, c], (r - u)/(r - c)
   on (c, r), else 0.
9. log(max(E_m, FLT_EPSILON)) when use_log_fbank; energy (when use_energy) floored at log(energy_floor)
   when energy_floor > 0 and put first (last with htk_compat).

Validated against kaldi-native-fbank 1.23 (the C++ Kaldi reference) in
tests/model_executor/models/audio/test_kaldi_fbank.py: max |diff| <= 1e-3 and mean |diff| <= 1e-5 on
log fbank of real speech, noise, tones, silence, clipping and frame-boundary lengths (measured values in
docs/design/audio_frontend.md). VTLN warping is not implemented (Kaldi's default vtln_warp=1 is a no-op).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.models.audio.constants_cache import device_constant
from vllm_omni_token2wav.model_executor.models.audio.dft import (
    DFT_IMPLS,
    DftImpl,
    default_dft_impl,
    power_spectrum,
)

logger = init_logger(__name__)

# float32 machine epsilon: Kaldi's log floor (std::numeric_limits<float>::epsilon()).
FLT_EPSILON = 1.1920928955078125e-07
WINDOW_TYPES: tuple[str, ...] = ("povey", "hanning", "hamming", "blackman", "rectangular")
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class FbankOptions:
    """Validated Kaldi fbank options plus the derived frame geometry (hashable: a constant-cache key)."""

    sample_frequency: float
    num_mel_bins: int
    frame_length: float
    frame_shift: float
    dither: float
    preemphasis_coefficient: float
    remove_dc_offset: bool
    window_type: str
    blackman_coeff: float
    round_to_power_of_two: bool
    snip_edges: bool
    low_freq: float
    high_freq: float
    use_log_fbank: bool
    use_power: bool
    use_energy: bool
    raw_energy: bool
    htk_compat: bool
    energy_floor: float

    @property
    def window_size(self) -> int:
        return int(self.sample_frequency * self.frame_length * 0.001)

    @property
    def window_shift(self) -> int:
        return int(self.sample_frequency * self.frame_shift * 0.001)

    @property
    def padded_window_size(self) -> int:
        w = self.window_size
        return 1 << (w - 1).bit_length() if self.round_to_power_of_two else w

    @property
    def resolved_high_freq(self) -> float:
        return self.high_freq if self.high_freq > 0.0 else 0.5 * self.sample_frequency + self.high_freq

    def num_frames(self, num_samples: int) -> int:
        """Kaldi's NumFrames(num_samples, opts) (flush=True)."""
        w, s = self.window_size, self.window_shift
        if self.snip_edges:
            return 0 if num_samples < w else 1 + (num_samples - w) // s
        return (num_samples + s // 2) // s

    def min_samples(self, num_frames: int = 1) -> int:
        """The smallest waveform length that yields `num_frames` frames."""
        w, s = self.window_size, self.window_shift
        if self.snip_edges:
            return w + (num_frames - 1) * s
        return max(1, num_frames * s - s // 2)

    def validate(self) -> None:
        fs = self.sample_frequency
        if not math.isfinite(fs) or fs <= 0:
            raise ValueError(f"kaldi_fbank: sample_frequency must be a positive number of Hz, got {fs}")
        if self.window_size < 2:
            raise ValueError(
                f"kaldi_fbank: frame_length={self.frame_length} ms at {fs} Hz gives {self.window_size} samples; "
                "a frame needs at least 2"
            )
        if self.window_shift < 1:
            raise ValueError(f"kaldi_fbank: frame_shift={self.frame_shift} ms at {fs} Hz gives no samples per shift")
        if self.num_mel_bins < 3:
            raise ValueError(f"kaldi_fbank: num_mel_bins must be >= 3 (Kaldi's limit), got {self.num_mel_bins}")
        if self.window_type not in WINDOW_TYPES:
            raise ValueError(f"kaldi_fbank: window_type must be one of {WINDOW_TYPES}, got {self.window_type!r}")
        if not math.isfinite(self.dither) or self.dither < 0:
            raise ValueError(f"kaldi_fbank: dither must be >= 0, got {self.dither}")
        if not 0.0 <= self.preemphasis_coefficient <= 1.0:
            raise ValueError(
                f"kaldi_fbank: preemphasis_coefficient must be in [0, 1], got {self.preemphasis_coefficient}"
            )
        if self.energy_floor < 0:
            raise ValueError(f"kaldi_fbank: energy_floor must be >= 0, got {self.energy_floor}")
        nyquist = 0.5 * fs
        high = self.resolved_high_freq
        if not (0.0 <= self.low_freq < nyquist and 0.0 < high <= nyquist and high > self.low_freq):
            raise ValueError(
                f"kaldi_fbank: need 0 <= low_freq < high_freq <= Nyquist ({nyquist} Hz); got low_freq="
                f"{self.low_freq}, high_freq={self.high_freq} (resolved to {high}; high_freq <= 0 means Nyquist + it)"
            )
        # Every bin must contain at least one FFT bin centre, otherwise Kaldi aborts (empty filter).
        fft_bin_width = fs / self.padded_window_size
        mel_delta = (_mel(high) - _mel(self.low_freq)) / (self.num_mel_bins + 1)
        if _mel(self.low_freq + fft_bin_width) - _mel(self.low_freq) > 2 * mel_delta:
            logger.warning_once(
                "kaldi_fbank: %d mel bins over %.0f-%.0f Hz with %.1f Hz FFT bins leaves some filters empty",
                self.num_mel_bins,
                self.low_freq,
                high,
                fft_bin_width,
            )


def _mel(freq_hz: float | torch.Tensor) -> float | torch.Tensor:
    """Kaldi's MelScale: 1127 ln(1 + f / 700)."""
    if isinstance(freq_hz, torch.Tensor):
        return 1127.0 * torch.log1p(freq_hz / 700.0)
    return 1127.0 * math.log1p(freq_hz / 700.0)


def _window(opts: FbankOptions) -> torch.Tensor:
    """Kaldi's FeatureWindowFunction, float64 [W] (computed in double as Kaldi does)."""
    w = opts.window_size
    i = torch.arange(w, dtype=torch.float64)
    a = 2.0 * math.pi / (w - 1)
    if opts.window_type == "hanning":
        return 0.5 - 0.5 * torch.cos(a * i)
    if opts.window_type == "hamming":
        return 0.54 - 0.46 * torch.cos(a * i)
    if opts.window_type == "povey":
        return (0.5 - 0.5 * torch.cos(a * i)).pow(0.85)
    if opts.window_type == "blackman":
        b = opts.blackman_coeff
        return b - 0.5 * torch.cos(a * i) + (0.5 - b) * torch.cos(2.0 * a * i)
    return torch.ones(w, dtype=torch.float64)


def _mel_banks(opts: FbankOptions) -> torch.Tensor:
    """Kaldi's MelBanks (no VTLN) as a dense float64 [P/2, num_mel_bins] matrix (transposed for matmul)."""
    num_fft_bins = opts.padded_window_size // 2
    fft_bin_width = opts.sample_frequency / opts.padded_window_size
    mel_low = _mel(opts.low_freq)
    mel_delta = (_mel(opts.resolved_high_freq) - mel_low) / (opts.num_mel_bins + 1)
    m = torch.arange(opts.num_mel_bins, dtype=torch.float64)[None, :]
    left = mel_low + m * mel_delta
    center = left + mel_delta
    right = center + mel_delta
    mel = torch.as_tensor(_mel(torch.arange(num_fft_bins, dtype=torch.float64) * fft_bin_width))[:, None]
    rising = (mel - left) / (center - left)
    falling = (right - mel) / (right - center)
    weights = torch.where(mel <= center, rising, falling)
    inside = (mel > left) & (mel < right)
    return torch.where(inside, weights, torch.zeros_like(weights))


def host_lengths(lengths: Sequence[int] | torch.Tensor, batch: int, num_samples: int) -> list[int]:
    """Validate per-item lengths (host metadata: Python ints or a CPU integer tensor)."""
    if isinstance(lengths, torch.Tensor):
        if lengths.device.type != "cpu":
            raise ValueError(
                f"kaldi_fbank: lengths must be host metadata (a list or a CPU tensor), got a tensor on "
                f"{lengths.device}; reading it would force a device->host sync"
            )
        if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
            raise ValueError(f"kaldi_fbank: lengths must be integers, got dtype {lengths.dtype}")
        if lengths.ndim != 1:
            raise ValueError(f"kaldi_fbank: lengths must be 1-D [B], got shape {tuple(lengths.shape)}")
        values = [int(v) for v in lengths.tolist()]
    else:
        values = []
        for v in lengths:
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"kaldi_fbank: lengths must be integers, got {v!r}")
            values.append(v)
    if len(values) != batch:
        raise ValueError(f"kaldi_fbank: lengths has {len(values)} entries for a batch of {batch} waveforms")
    bad = [(i, v) for i, v in enumerate(values) if not 0 < v <= num_samples]
    if bad:
        i, v = bad[0]
        raise ValueError(f"kaldi_fbank: lengths[{i}] = {v} is outside [1, {num_samples}] (the padded waveform length)")
    return values


def _reflect_indices(length: int, offset: int, item_lengths: torch.Tensor) -> torch.Tensor:
    """[B, length] sample indices j + offset mirrored into [0, n_b) per item (Kaldi's edge mirroring).

    Mirroring with x[-1 - i] = x[i] and x[n + i] = x[n - 1 - i] is periodic with period 2n, so one
    modulo and one fold give the index for any distance outside the signal.
    """
    j = torch.arange(length, device=item_lengths.device, dtype=torch.int64)[None, :] + offset
    n = item_lengths[:, None]
    r = torch.remainder(j, 2 * n)
    return torch.where(r >= n, 2 * n - 1 - r, r)


def _process_frames(
    frames: torch.Tensor, opts: FbankOptions, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Steps 3-6 elementwise: (windowed frames, log energy when use_energy else None)."""
    if opts.remove_dc_offset:
        frames = frames - frames.mean(dim=-1, keepdim=True)
        # Second pass removes the rounding error of the first mean (the subtraction itself is exact
        # while samples and mean are within a factor 2): matters for audio riding on a large DC offset.
        frames = frames - frames.mean(dim=-1, keepdim=True)
    log_energy: torch.Tensor | None = None
    if opts.use_energy and opts.raw_energy:
        log_energy = frames.square().sum(dim=-1).clamp(min=FLT_EPSILON).log()
    if opts.preemphasis_coefficient != 0.0:
        previous = torch.cat([frames[..., :1], frames[..., :-1]], dim=-1)
        frames = frames - opts.preemphasis_coefficient * previous
    window_key = (opts.window_type, opts.window_size, opts.blackman_coeff)
    frames = frames * device_constant("kaldi_window", window_key, device, lambda: _window(opts))
    if opts.use_energy and not opts.raw_energy:
        log_energy = frames.square().sum(dim=-1).clamp(min=FLT_EPSILON).log()
    return frames, log_energy


def _check_finite(x: torch.Tensor, check_finite: bool | None) -> None:
    do_check = x.device.type == "cpu" if check_finite is None else check_finite
    if do_check and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(
            f"kaldi_fbank: waveform contains {bad} NaN/Inf sample(s); decode or resampling produced invalid audio"
        )


def kaldi_fbank(
    waveform: torch.Tensor,
    *,
    sample_frequency: float = 16000.0,
    num_mel_bins: int = 80,
    frame_length: float = 25.0,
    frame_shift: float = 10.0,
    dither: float = 0.0,
    preemphasis_coefficient: float = 0.97,
    remove_dc_offset: bool = True,
    window_type: str = "povey",
    blackman_coeff: float = 0.42,
    round_to_power_of_two: bool = True,
    snip_edges: bool = True,
    low_freq: float = 20.0,
    high_freq: float = 0.0,
    use_log_fbank: bool = True,
    use_power: bool = True,
    use_energy: bool = False,
    raw_energy: bool = True,
    htk_compat: bool = False,
    energy_floor: float = 0.0,
    lengths: Sequence[int] | torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    check_finite: bool | None = None,
    dft_impl: DftImpl | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Kaldi `compute-fbank-feats` features of `waveform` (formula in the module docstring).

    Args:
        waveform: [N] or [B, N] float tensor on any device, in the caller's scale (CosyVoice uses
            [-1, 1]; Kaldi's tools use int16 values). Computed in float32.
        sample_frequency ... energy_floor: Kaldi's options and defaults, except num_mel_bins=80 (the
            CAM++ input; Kaldi's default is 23) and dither=0.0 (as torchaudio; Kaldi's binary uses 1.0
            on int16-scale audio).
        lengths: per-item valid lengths of a [B, N] batch padded at the end (list of ints or a CPU
            integer tensor, host metadata). Each item then gets exactly its unbatched frames.
        generator: torch.Generator on the waveform's device for reproducible dither.
        check_finite: raise ValueError on NaN/Inf samples. None (default) checks on CPU tensors only,
            where it is free; on an accelerator the check costs a device->host sync, so it is skipped
            there unless True is passed (`load_audio` already checks on the host).
        dft_impl: "fft" or "matmul" (default: `dft.default_dft_impl()` for the current platform).

    Returns:
        float32 features on the waveform's device: [T, num_mel_bins (+1 with use_energy)] for [N]
        input, [B, T, ...] for [B, N]. With `lengths`, a tuple (features [B, T_max, D], frame_counts
        [B] int64 CPU tensor): frames at or after frame_counts[b] are zero. T_max is the frame count of
        the padded length N, so it never needs a device value.

    Raises:
        ValueError: non-tensor or non-float input, wrong rank, empty input, fewer samples than one
            frame, bad lengths, bad options, NaN/Inf (see check_finite).
    """
    opts = FbankOptions(
        sample_frequency=float(sample_frequency),
        num_mel_bins=int(num_mel_bins),
        frame_length=float(frame_length),
        frame_shift=float(frame_shift),
        dither=float(dither),
        preemphasis_coefficient=float(preemphasis_coefficient),
        remove_dc_offset=bool(remove_dc_offset),
        window_type=str(window_type),
        blackman_coeff=float(blackman_coeff),
        round_to_power_of_two=bool(round_to_power_of_two),
        snip_edges=bool(snip_edges),
        low_freq=float(low_freq),
        high_freq=float(high_freq),
        use_log_fbank=bool(use_log_fbank),
        use_power=bool(use_power),
        use_energy=bool(use_energy),
        raw_energy=bool(raw_energy),
        htk_compat=bool(htk_compat),
        energy_floor=float(energy_floor),
    )
    opts.validate()
    impl: DftImpl = default_dft_impl() if dft_impl is None else dft_impl
    if impl not in DFT_IMPLS:
        raise ValueError(f"kaldi_fbank: dft_impl must be one of {DFT_IMPLS}, got {dft_impl!r}")

    if not isinstance(waveform, torch.Tensor):
        raise ValueError(f"kaldi_fbank: waveform must be a torch.Tensor, got {type(waveform).__name__}")
    if waveform.dtype not in _FLOAT_DTYPES:
        raise ValueError(
            f"kaldi_fbank: waveform must be a float tensor, got dtype {waveform.dtype}; convert integer PCM "
            "with load_audio (or divide int16 by 32768) first"
        )
    if waveform.ndim not in (1, 2):
        raise ValueError(f"kaldi_fbank: waveform must be [N] or [B, N], got shape {tuple(waveform.shape)}")
    batched = waveform.ndim == 2
    x = waveform.to(torch.float32)
    if not batched:
        x = x.unsqueeze(0)
    batch, num_samples = x.shape
    if batch == 0 or num_samples == 0:
        raise ValueError(f"kaldi_fbank: waveform is empty (shape {tuple(waveform.shape)})")
    _check_finite(x, check_finite)

    item_lengths = [num_samples] * batch if lengths is None else host_lengths(lengths, batch, num_samples)
    frame_counts = [opts.num_frames(n) for n in item_lengths]
    if min(frame_counts) < 1:
        i = frame_counts.index(min(frame_counts))
        n = item_lengths[i]
        raise ValueError(
            f"kaldi_fbank: waveform{f'[{i}]' if batched else ''} has {n} samples "
            f"({1000.0 * n / opts.sample_frequency:.1f} ms at {opts.sample_frequency:g} Hz); one "
            f"{opts.frame_length:g} ms frame needs {opts.min_samples(1)} samples"
        )
    num_frames = opts.num_frames(num_samples)
    w, s = opts.window_size, opts.window_shift

    if opts.snip_edges:
        frames = x.unfold(-1, w, s)[:, :num_frames]
    else:
        extended = (num_frames - 1) * s + w
        n_items = torch.tensor(item_lengths, dtype=torch.int64).to(x.device)
        idx = _reflect_indices(extended, s // 2 - w // 2, n_items)
        frames = torch.gather(x, 1, idx).unfold(-1, w, s)

    if opts.dither != 0.0:
        noise = torch.randn(frames.shape, generator=generator, device=frames.device, dtype=frames.dtype)
        frames = frames + opts.dither * noise
    padded = opts.padded_window_size
    frames, log_energy = _process_frames(frames, opts, x.device)
    spectrum = power_spectrum(frames, padded, padded // 2, impl)
    if not opts.use_power:
        spectrum = spectrum.sqrt()
    banks_key = (opts.sample_frequency, opts.num_mel_bins, opts.low_freq, opts.resolved_high_freq, padded)
    banks = device_constant("kaldi_mel_banks", banks_key, x.device, lambda: _mel_banks(opts))
    feats = torch.matmul(spectrum, banks)
    if opts.use_log_fbank:
        feats = feats.clamp(min=FLT_EPSILON).log()
    if log_energy is not None:
        if opts.energy_floor > 0.0:
            log_energy = log_energy.clamp(min=math.log(opts.energy_floor))
        energy = log_energy.unsqueeze(-1)
        feats = torch.cat([feats, energy] if opts.htk_compat else [energy, feats], dim=-1)

    if lengths is None:
        return feats if batched else feats[0]
    counts = torch.tensor(frame_counts, dtype=torch.int64)
    if min(frame_counts) < num_frames:
        valid = torch.arange(num_frames, device=x.device)[None, :] < counts.to(x.device)[:, None]
        feats = torch.where(valid.unsqueeze(-1), feats, torch.zeros((), dtype=feats.dtype, device=feats.device))
    return (feats if batched else feats[0]), counts
