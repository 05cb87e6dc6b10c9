# SPDX-License-Identifier: Apache-2.0
"""The causal HiFT's excitation: per-frame sines with a carried phase, plus the fixed noise table.

The reference `SineGen2(causal=True)` differs from HiFT's sine generator in two ways: the phase is
up-sampled to the waveform rate with *nearest* (the sines are constant over each 480-sample frame)
and the noise comes from the fixed uniform table (`noise.py`) instead of fresh Gaussian draws.
Both make the excitation a function of frame-level state only, so it is computed per mel frame and
repeated 480 times, and a stream carries one phase value per harmonic between chunks.

The phase of harmonic h at frame j is 2 pi * 480 * sum_{i<=j} rad_i, rad = (f0 * h / 24000) mod 1
(the down-sampled increment of a frame is its own increment: f0 is constant over the frame and
the linear 1/480 down-sampling averages two samples of it). Two numerics are in use:

| `PhaseMode`        | accumulation                                           | used by                         |
|--------------------|--------------------------------------------------------|---------------------------------|
| `CUMULATIVE_FP32`  | float32 cumsum from the utterance start, x 2 x pi x 480 | CosyVoice3 `inference` (whole   |
|                    | in float32 (the CPU cumsum accumulates in double and   | and non-final), vLLM-Omni 0.30  |
|                    | rounds each output; the stream carries that double)    | whole utterance                 |
| `WRAPPED_FP64`     | float64 cumsum x 480 + carried phase, taken mod 1 per  | minicpmo-utils 1.0.7            |
|                    | block of frames; sin in float64, then float32          | `BoundedVocoder`                |

The float32 form loses phase precision as the utterance grows (at 60 s the phase is ~1e5 rad,
float32 steps there are ~0.008 rad): it is kept because it is what CosyVoice3 outputs; streaming
it chunk by chunk reproduces it exactly because the double accumulator is carried.
"""

from __future__ import annotations

import enum
import math

import torch

from vllm_omni_token2wav.model_executor.layers.hift.source import (
    HarmonicMerge,
    excitation,
    harmonic_increments,
    voiced,
)
from vllm_omni_token2wav.model_executor.layers.hift_causal.config import CausalHiFTConfig


class PhaseMode(str, enum.Enum):
    """How the sine phase is accumulated (see the module docstring)."""

    CUMULATIVE_FP32 = "cumulative_fp32"
    WRAPPED_FP64 = "wrapped_fp64"


class CausalSource(HarmonicMerge):
    """F0 frames -> excitation samples [B, 480 n]; the learned part is `l_linear` (key `m_source.l_linear`)."""

    def __init__(self, config: CausalHiFTConfig, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(config.nb_harmonics, dtype=dtype)
        self.config = config

    @property
    def harmonics(self) -> int:
        return self.config.nb_harmonics + 1

    def initial_phase(self, batch: int, device: torch.device | str) -> torch.Tensor:
        """Phase state at the utterance start: [B, H] float64 zeros (accumulator or wrapped phase)."""
        return torch.zeros(batch, self.harmonics, dtype=torch.float64, device=device)

    def frame_sines(
        self,
        f0: torch.Tensor,
        phase: torch.Tensor,
        mode: PhaseMode,
        block_frames: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """f0 [B, n] float32 (Hz) -> (sines x sine_amp [B, n, H] float32, phase after the n frames).

        `block_frames` splits the wrapped-phase accumulation into blocks the way the bounded vocoder
        of minicpmo-utils does (it only moves the mod-1 rounding points; the cumulative mode is
        exact for any split and ignores it).
        """
        cfg = self.config
        rad = harmonic_increments(f0[..., None], cfg.nb_harmonics, cfg.sampling_rate)
        scale = cfg.upsample_scale
        if mode is PhaseMode.CUMULATIVE_FP32:
            # torch's CPU float32 cumsum adds in double and rounds every output: carry the double sum.
            running = torch.cumsum(torch.cat([phase[:, None, :], rad.double()], dim=1), dim=1)[:, 1:]
            cycles = running.to(rad.dtype)
            sines = torch.sin(cycles * 2 * math.pi * scale)
            new_phase = running[:, -1] if running.shape[1] else phase
        elif mode is PhaseMode.WRAPPED_FP64:
            step = block_frames or max(rad.shape[1], 1)
            parts = []
            new_phase = phase
            for part in rad.split(step, dim=1):
                cycles64 = part.double().cumsum(dim=1) * scale + new_phase[:, None, :]
                new_phase = cycles64[:, -1].remainder(1)
                parts.append((cycles64.remainder(1) * (2 * math.pi)).sin().to(rad.dtype))
            sines = torch.cat(parts, dim=1) if parts else rad.new_zeros(rad.shape)
        else:
            raise ValueError(f"unknown phase mode {mode!r}")
        return sines * cfg.nsf_alpha, new_phase

    def forward(
        self,
        f0: torch.Tensor,
        phase: torch.Tensor,
        noise: torch.Tensor,
        mode: PhaseMode,
        block_frames: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """f0 [B, n] float32, noise [480 n, H] -> (source [B, 480 n] in l_linear's dtype, new phase).

        `noise` is [480 n, H] when every row is at the same sample position (one request's rows), or
        [B, 480 n, H] with each row's own window (rows of several streams stacked into one launch).
        The frame-level part (phase, sines) runs where `f0` and `phase` are (the F0 device); the
        sample-level part where `l_linear` is.
        """
        cfg = self.config
        sines, new_phase = self.frame_sines(f0, phase, mode, block_frames)
        uv = voiced(f0, cfg.nsf_voiced_threshold)[..., None]
        device = self.l_linear.weight.device
        scale = cfg.upsample_scale
        if mode is PhaseMode.CUMULATIVE_FP32:
            # The reference up-samples [B, H, T] and transposes: l_linear then reads a harmonic-major
            # [B, L, H] view, which changes the GEMM's summation order. Same layout, same bits.
            sines = torch.repeat_interleave(sines.to(device).transpose(1, 2), scale, dim=2).transpose(1, 2)
        else:
            sines = torch.repeat_interleave(sines.to(device), scale, dim=1)
        uv = torch.repeat_interleave(uv.to(device), scale, dim=1)
        noise = noise.to(device)
        values = excitation(sines, uv, noise if noise.dim() == 3 else noise[None], cfg.nsf_alpha, cfg.nsf_sigma)
        return self.merge(values.to(self.l_linear.weight.dtype)).squeeze(-1), new_phase
