# SPDX-License-Identifier: Apache-2.0
"""Neural-source-filter excitation of HiFT: F0 -> harmonic sine source at 24 kHz.

The reference sine generator integrates the per-sample phase increment at the mel rate: it
linearly interpolates the increments down by 1/480, takes the cumulative sum, and interpolates
the phase back up by 480. The down-interpolation (`F.interpolate(..., scale_factor=1/480,
mode="linear")`) does not run on Ascend (error 507015), so this module uses its closed form.

With `align_corners=False` output frame j of a 1/s linear down-interpolation samples the input at
coordinate (j + 0.5) * s - 0.5. For even s that is the midpoint between samples s*j + s/2 - 1 and
s*j + s/2, with both weights exactly 0.5, so

    down[j] = 0.5 * x[s*j + s/2 - 1] + 0.5 * x[s*j + s/2]        (s = 480: x[239::480], x[240::480])

is the same arithmetic the interpolation kernel performs (validated bit-equal against torch 2.13
CPU `F.interpolate`; the tests require 1e-6). For odd s the coordinate is the integer s*j + (s-1)/2.

Consequence worth knowing: sample 0 never enters the down-interpolation, so the reference's
random initial phase (added to sample 0 only) does not reach the output. It is still drawn, to keep
the RNG stream identical to the reference: per call `rand(B, H)` (initial phases), then a Gaussian
[B, L, H] (additive noise of the harmonics), then `randn(B, L, 1)` (the source module's noise
output, unused by HiFT). The harmonics' noise is the reference's `randn_like(sines)`, and its sines
are a transposed [B, H, L] tensor: `randn_like` keeps those strides and torch fills a
non-contiguous tensor by another path than a contiguous `randn`, so the values (not only their
order) differ from `randn(B, L, H)`. `transposed_randn` draws exactly what the reference draws.

Per-row noise (`NoiseSource`): a serving stage vocodes the chunks of several requests in one batch,
and each request's audio must not depend on what else shares the batch. Passing one generator per
row makes row i draw `rand(1, H)`, `randn(1, L, H)`, `randn(1, L, 1)` from its own generator, in the
same order as a batch-1 call with that generator, so a row's noise is bit-identical to its solo run.
A `None` entry (a padding row) gets zeros and consumes nothing.

Noise drawn ahead (`DrawnNoise`, `draw_ahead`): a captured device graph replays kernels and cannot
run Python, so it cannot draw from per-row generators (the draws happen on the host side of the
generator API). `draw_ahead(generators, ...)` draws every row's three tensors from its generator in
the batch-1 order, before the call; passed as the `generator`, the source reads them instead of
drawing. Row i's noise is the same values as with `generators` themselves, and each generator ends
in the same state, so a captured HiFT call gives the audio of the eager per-row one.

The harmonic increments, the excitation formula and the learned merge (`HarmonicMerge`) are shared
with CosyVoice3's causal source (`layers/hift_causal/source.py`), which differs only in how it makes
the phase (nearest up-sampling, carried between chunks) and the noise (a fixed table).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

#: Which of the three draws of one HiFT source call (in the order they happen).
NoiseRole = Literal["initial_phase", "harmonics", "source"]


@dataclass(frozen=True)
class DrawnNoise:
    """The per-row NSF noise of one batch, drawn before the call (`draw_ahead`; see the module docstring).

    `initial_phase` is `rand` [B, H], `harmonics` is `randn` [B, L, H]; the source module's own
    `randn` [B, L, 1] is drawn too (to advance each generator as a call would) but never used, so it is
    not kept. Padding rows hold zeros.
    """

    initial_phase: torch.Tensor
    harmonics: torch.Tensor


#: One generator for the whole batch (reference behaviour), one per row (batched serving), noise
#: drawn ahead per row (captured calls), or None (torch's global RNG, as the reference).
NoiseSource = torch.Generator | Sequence[torch.Generator | None] | DrawnNoise | None


def transposed_randn(
    shape: tuple[int, ...], *, generator: torch.Generator | None, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """Gaussian [B, L, H] filled as the reference's `randn_like` of its [B, H, L]-strided sines (module docstring)."""
    batch, length, harmonics = shape
    buffer = torch.empty((batch, harmonics, length), device=device, dtype=dtype)
    return buffer.transpose(1, 2).normal_(generator=generator)


def draw(
    fn: Callable[..., torch.Tensor],
    shape: tuple[int, ...],
    generator: NoiseSource,
    *,
    device: torch.device,
    dtype: torch.dtype,
    role: NoiseRole,
) -> torch.Tensor:
    """`fn(shape)` (`torch.rand` / `torch.randn`) from `generator`; a sequence draws row by row.

    With a sequence, row i is `fn((1, *shape[1:]), generator=generator[i])`: exactly what a batch-1
    call with that generator draws, whatever the other rows are. `None` rows are zeros. With
    `DrawnNoise` the tensor of `role` is returned (a copy: callers modify it), nothing is drawn.
    """
    if isinstance(generator, DrawnNoise):
        if role == "source":  # drawn ahead only to advance the generators; the caller discards it
            return generator.harmonics.new_empty((0,))
        drawn = generator.initial_phase if role == "initial_phase" else generator.harmonics
        if tuple(drawn.shape) != tuple(shape):
            raise ValueError(
                f"NSF noise drawn ahead: {role} is {list(drawn.shape)}, this call needs {list(shape)}; "
                "draw it with draw_ahead() for this batch and mel length"
            )
        return drawn.to(device=device, dtype=dtype, copy=True)
    if role == "harmonics":
        fn = transposed_randn
    if generator is None or isinstance(generator, torch.Generator):
        return fn(shape, generator=generator, device=device, dtype=dtype)
    if len(generator) != shape[0]:
        raise ValueError(f"NSF noise: {len(generator)} per-row generators for a batch of {shape[0]} rows")
    rows = [
        torch.zeros((1, *shape[1:]), device=device, dtype=dtype)
        if gen is None
        else fn((1, *shape[1:]), generator=gen, device=device, dtype=dtype)
        for gen in generator
    ]
    return rows[0] if len(rows) == 1 else torch.cat(rows, dim=0)


def draw_ahead(
    generators: Sequence[torch.Generator | None],
    length: int,
    harmonics: int,
    *,
    device: torch.device,
    dtype: torch.dtype,
) -> DrawnNoise:
    """Draw the noise of one per-row HiFT source call of `length` waveform samples and `harmonics` sines.

    Row i draws `rand(1, H)`, `randn(1, L, H)`, `randn(1, L, 1)` from `generators[i]`, the order of a
    batch-1 call (`SineGen._phase`, `SineGen.forward`, `SourceModuleHnNSF.forward`); `None` rows are
    zeros and draw nothing.
    """
    phases, noises = [], []
    for gen in generators:
        if gen is None:
            phases.append(torch.zeros((1, harmonics), device=device, dtype=dtype))
            noises.append(torch.zeros((1, length, harmonics), device=device, dtype=dtype))
            continue
        phases.append(torch.rand((1, harmonics), generator=gen, device=device, dtype=dtype))
        noises.append(transposed_randn((1, length, harmonics), generator=gen, device=device, dtype=dtype))
        torch.randn((1, length, 1), generator=gen, device=device, dtype=dtype)  # the source module's own draw
    return DrawnNoise(torch.cat(phases, dim=0), torch.cat(noises, dim=0))


def midpoint_downsample(x: torch.Tensor, scale: int) -> torch.Tensor:
    """Closed form of `F.interpolate(x, scale_factor=1/scale, mode="linear")` on the last dim.

    `x` is [..., L] with L a multiple of `scale`; returns [..., L // scale].
    """
    if scale < 1:
        raise ValueError(f"midpoint_downsample: scale must be >= 1, got {scale}")
    length = x.shape[-1]
    if length % scale:
        raise ValueError(f"midpoint_downsample: length {length} is not a multiple of the scale {scale}")
    if scale % 2:
        return x[..., (scale - 1) // 2 :: scale]
    half = scale // 2
    return x[..., half - 1 :: scale] * 0.5 + x[..., half::scale] * 0.5


def harmonic_increments(f0: torch.Tensor, harmonic_num: int, sampling_rate: int) -> torch.Tensor:
    """f0 [..., 1] (Hz) -> per-sample phase increments [..., H] in cycles of harmonics 1..H, mod 1.

    H = harmonic_num + 1. Only the fractional part matters for the phase; the reference computes
    it the same way, `(f0 * [1..H] / sampling_rate) % 1`, in f0's dtype.
    """
    harmonics = torch.arange(1, harmonic_num + 2, device=f0.device, dtype=f0.dtype)
    return torch.remainder(f0 * harmonics / sampling_rate, 1.0)


def voiced(f0: torch.Tensor, threshold: float) -> torch.Tensor:
    """1.0 where f0 > threshold (voiced), else 0.0, in f0's dtype."""
    return (f0 > threshold).to(f0.dtype)


def excitation(
    sines: torch.Tensor, uv: torch.Tensor, noise: torch.Tensor, sine_amp: float, noise_std: float
) -> torch.Tensor:
    """Harmonic excitation: sines * uv + noise * (uv * noise_std + (1 - uv) * sine_amp / 3).

    `sines` are already scaled by `sine_amp`; `noise` is the raw draw (Gaussian in HiFT, uniform
    table values in the causal HiFT). Voiced samples get the sines plus faint noise, unvoiced ones
    noise of std ~ sine_amp / 3 only. The operation order is the reference's, so float32 results
    are bit-identical to it.
    """
    noise_amp = uv * noise_std + (1 - uv) * sine_amp / 3
    return sines * uv + noise_amp * noise


class SineGen(nn.Module):
    """Harmonic sine generator (fundamental + `harmonic_num` overtones), no parameters.

    Input f0 [B, L, 1] at the waveform rate; returns (sines [B, L, H], uv [B, L, 1]) with
    H = harmonic_num + 1. Unvoiced samples (f0 <= threshold) carry only noise of std sine_amp / 3.
    """

    def __init__(
        self,
        sampling_rate: int,
        upsample_scale: int,
        harmonic_num: int,
        sine_amp: float,
        noise_std: float,
        voiced_threshold: float,
        use_interpolate: bool = False,
    ) -> None:
        super().__init__()
        self.sampling_rate = sampling_rate
        self.upsample_scale = upsample_scale
        self.harmonic_num = harmonic_num
        self.sine_amp = sine_amp
        self.noise_std = noise_std
        self.voiced_threshold = voiced_threshold
        # False: closed-form midpoint (runs everywhere). True: the reference's F.interpolate.
        self.use_interpolate = use_interpolate

    def _phase(self, rad: torch.Tensor, generator: NoiseSource) -> torch.Tensor:
        batch, _, dim = rad.shape
        rand_ini = draw(torch.rand, (batch, dim), generator, device=rad.device, dtype=rad.dtype, role="initial_phase")
        rand_ini[:, 0] = 0.0
        rad[:, 0, :] = rad[:, 0, :] + rand_ini
        rad = rad.transpose(1, 2)  # [B, H, L]
        if self.use_interpolate:
            down = F.interpolate(rad, scale_factor=1.0 / self.upsample_scale, mode="linear")
        else:
            down = midpoint_downsample(rad, self.upsample_scale)
        return self._upsampled_phase(down)

    def _upsampled_phase(self, down: torch.Tensor) -> torch.Tensor:
        """Frame-rate increments [B, H, T] -> phase [B, L, H]: cumulative sum, x 2 pi, linear x scale."""
        phase = torch.cumsum(down, dim=-1) * (2.0 * math.pi)
        phase = F.interpolate(phase * self.upsample_scale, scale_factor=float(self.upsample_scale), mode="linear")
        return phase.transpose(1, 2)  # [B, L, H]

    def _frame_phase(self, f0_frames: torch.Tensor, generator: NoiseSource) -> torch.Tensor:
        """`_phase` of `repeat_interleave(f0_frames, scale)` without its sample-rate increments.

        Each frame's `scale` samples share one f0, so both samples the midpoint reads (239 and 240
        of each 480) hold the frame's increment r and the down-sampled value is `0.5 r + 0.5 r`:
        computed here on the frame-rate increments with the same arithmetic, bit for bit. The
        initial phases are still drawn (RNG order); they only touch sample 0, which no midpoint
        reads for scale >= 2.
        """
        rad = harmonic_increments(f0_frames, self.harmonic_num, self.sampling_rate).transpose(1, 2)  # [B, H, T]
        draw(
            torch.rand,
            (rad.shape[0], rad.shape[1]),
            generator,
            device=rad.device,
            dtype=rad.dtype,
            role="initial_phase",
        )
        down = rad if self.upsample_scale % 2 else rad * 0.5 + rad * 0.5
        return self._upsampled_phase(down)

    def forward(
        self, f0: torch.Tensor, generator: NoiseSource = None, *, f0_frames: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """f0 [B, L, 1] at the waveform rate -> (excitation [B, L, H], uv [B, L, 1]).

        `f0_frames` [B, L / scale, 1]: the frame-rate f0 that `f0` repeats `scale` times (HiFT's
        case); its phase is computed at the frame rate (`_frame_phase`, identical results, no
        sample-rate remainder / division / down-sampling passes).
        """
        if f0_frames is not None and self.upsample_scale >= 2 and not self.use_interpolate:
            phase = self._frame_phase(f0_frames, generator)
        else:
            phase = self._phase(harmonic_increments(f0, self.harmonic_num, self.sampling_rate), generator)
        sines = torch.sin(phase) * self.sine_amp
        uv = voiced(f0, self.voiced_threshold)
        noise = draw(
            torch.randn, tuple(sines.shape), generator, device=sines.device, dtype=sines.dtype, role="harmonics"
        )
        return excitation(sines, uv, noise, self.sine_amp, self.noise_std), uv


class HarmonicMerge(nn.Module):
    """Merge the harmonics into one excitation channel: tanh(Linear(H -> 1)). Key: `l_linear`.

    The learned part of the NSF source, shared by HiFT's `SourceModuleHnNSF` and the causal HiFT's
    source (which differ in how they make the sines and the noise).
    """

    def __init__(self, harmonic_num: int, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.l_linear = nn.Linear(harmonic_num + 1, 1, dtype=dtype)

    def merge(self, sines: torch.Tensor) -> torch.Tensor:
        """[B, L, H] excitation of every harmonic -> [B, L, 1] source."""
        return torch.tanh(self.l_linear(sines))


class SourceModuleHnNSF(HarmonicMerge):
    """HiFT's source: `SineGen` (random initial phase and Gaussian noise) merged by `l_linear`."""

    def __init__(
        self,
        sampling_rate: int,
        upsample_scale: int,
        harmonic_num: int,
        sine_amp: float,
        add_noise_std: float,
        voiced_threshold: float,
        *,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(harmonic_num, dtype=dtype)
        self.sine_amp = sine_amp
        self.l_sin_gen = SineGen(sampling_rate, upsample_scale, harmonic_num, sine_amp, add_noise_std, voiced_threshold)

    def forward(
        self, f0: torch.Tensor, generator: NoiseSource = None, *, f0_frames: torch.Tensor | None = None
    ) -> torch.Tensor:
        """f0 [B, L, 1] at the waveform rate -> source [B, L, 1] (`f0_frames`: see `SineGen.forward`)."""
        with torch.no_grad():
            sines, uv = self.l_sin_gen(f0, generator, f0_frames=f0_frames)
        merged = self.merge(sines)
        # The reference also returns this noise; HiFT ignores it, but drawing it keeps the RNG
        # stream (and so every later call) identical to the reference.
        draw(torch.randn, tuple(uv.shape), generator, device=uv.device, dtype=uv.dtype, role="source")
        return merged
