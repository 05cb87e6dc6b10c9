# SPDX-License-Identifier: Apache-2.0
"""Conditional flow-matching sampler of the flow model (reference `CausalConditionalCFM`, inference only).

Integrates `dx/dt = v(x, t)` from Gaussian noise at t=0 to a mel at t=1 with the Euler / cosine-schedule /
classifier-free-guidance loop of `euler.py` (shared with CosyVoice3), r = inference_cfg_rate (0.7).

The noise is a fixed buffer `rand_noise (1, 80, 30000)` (10 minutes at 50 Hz): whole utterances read
`[:T]`, a streaming chunk reads `[off : off + T]` with `off` = the estimator cache length. The
reference draws it unseeded at construction; here it comes from `noise_seed` (reproducible across
processes) and `set_noise()` installs any other (e.g. a reference run's) noise. It is non-persistent.

Streaming cache layouts (per Euler step k): cnn `(n, depth, 2, 2 * hidden, 2)`,
att `(n, depth, 2, heads, t, 2 * head_dim)`; the 2 is the CFG batch. The reference keeps them in
scratch buffers of 16 step slots and 1000 frames and hands out views; here every call returns fresh
tensors with exactly `n` step slots, and the 1000-frame limit is kept as an explicit check
(`max_cache_frames`) so a too-long prompt is a clear error instead of a shape crash.
"""

from __future__ import annotations

import torch
from torch import nn

from vllm_omni_token2wav.model_executor.layers.flow.dit import DiT
from vllm_omni_token2wav.model_executor.layers.flow.euler import cfg_pair, cosine_t_span, euler_cfg

__all__ = ["MAX_CACHE_FRAMES", "NOISE_FRAMES", "CausalConditionalCFM", "cosine_t_span"]

#: Frames of the reference noise buffer (600 s at 50 Hz).
NOISE_FRAMES = 50 * 600
#: The reference's scratch buffers hold cache + chunk up to this many frames.
MAX_CACHE_FRAMES = 1000


class CausalConditionalCFM(nn.Module):
    rand_noise: torch.Tensor

    def __init__(
        self,
        estimator: DiT,
        inference_cfg_rate: float = 0.7,
        *,
        noise_seed: int = 0,
        noise_frames: int = NOISE_FRAMES,
        max_cache_frames: int = MAX_CACHE_FRAMES,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if not inference_cfg_rate > 0:
            raise ValueError(f"CausalConditionalCFM: inference_cfg_rate must be > 0, got {inference_cfg_rate}")
        self.estimator = estimator
        self.inference_cfg_rate = float(inference_cfg_rate)
        self.out_channels = estimator.out_channels
        self.max_cache_frames = max_cache_frames
        gen = torch.Generator().manual_seed(noise_seed)
        noise = torch.randn(1, self.out_channels, noise_frames, generator=gen, dtype=torch.float32)
        self.register_buffer("rand_noise", noise.to(dtype), persistent=False)

    def set_noise(self, noise: torch.Tensor) -> None:
        """Install a noise buffer `(1, out_channels, N)` (copied; kept on this module's device and dtype)."""
        if noise.dim() != 3 or noise.size(0) != 1 or noise.size(1) != self.out_channels:
            raise ValueError(
                f"CausalConditionalCFM.set_noise: noise has shape {tuple(noise.shape)}, expected "
                f"(1, {self.out_channels}, N)"
            )
        self.rand_noise = noise.detach().to(device=self.rand_noise.device, dtype=self.rand_noise.dtype).clone()

    def noise(self, offset: int, frames: int) -> torch.Tensor:
        """`rand_noise[..., offset : offset + frames]`, or a clear error past the end of the buffer."""
        if offset + frames > self.rand_noise.size(2):
            raise ValueError(
                f"CausalConditionalCFM: noise frames {offset}..{offset + frames} requested but the noise buffer "
                f"holds {self.rand_noise.size(2)} (600 s at 50 Hz in the reference)"
            )
        return self.rand_noise[:, :, offset : offset + frames]

    @torch.inference_mode()
    def forward(
        self,
        mu: torch.Tensor,
        mask: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        n_timesteps: int = 10,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """mu, cond `(1, C, T)`, mask `(1, 1, T)`, spks `(1, C)` -> mel `(1, C, T)`."""
        x = self.noise(0, mu.size(2)).to(mu.dtype) * temperature
        mask_in = torch.cat([mask, mask], dim=0)
        mu_in, spks_in, cond_in = cfg_pair(mu), cfg_pair(spks), cfg_pair(cond)

        def velocity(step: int, x_in: torch.Tensor, t_in: torch.Tensor) -> torch.Tensor:
            return self.estimator(x_in, mask_in, mu_in, t_in, spks_in, cond_in)

        return euler_cfg(x, n_timesteps, self.inference_cfg_rate, velocity)

    @torch.inference_mode()
    def forward_chunk(
        self,
        mu: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        n_timesteps: int = 10,
        temperature: float = 1.0,
        cnn_cache: torch.Tensor | None = None,
        att_cache: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One streaming chunk: mu, cond `(1, C, T)`, spks `(1, C)` -> (mel, new cnn cache, new att cache)."""
        if (cnn_cache is None) != (att_cache is None):
            raise ValueError("CausalConditionalCFM.forward_chunk: give both estimator caches or neither")
        for name, cache in (("cnn", cnn_cache), ("att", att_cache)):
            if cache is not None and cache.size(0) != n_timesteps:
                raise ValueError(
                    f"CausalConditionalCFM.forward_chunk: estimator {name} cache has {cache.size(0)} step slots but "
                    f"n_timesteps={n_timesteps}; a stream must keep the n_timesteps it was set up with"
                )
        offset = att_cache.size(4) if att_cache is not None else 0
        frames = mu.size(2)
        if offset + frames > self.max_cache_frames:
            raise ValueError(
                f"CausalConditionalCFM.forward_chunk: estimator cache ({offset} frames) + chunk ({frames} frames) = "
                f"{offset + frames} > {self.max_cache_frames}, the reference's scratch limit; keep the prompt under "
                f"about {(self.max_cache_frames - 156) / 50:.0f} s and trim the cache to prompt + 100 frames"
            )
        x = self.noise(offset, frames).to(mu.dtype) * temperature
        mu_in, spks_in, cond_in = cfg_pair(mu), cfg_pair(spks), cfg_pair(cond)
        new_cnn: list[torch.Tensor] = []
        new_att: list[torch.Tensor] = []

        def velocity(step: int, x_in: torch.Tensor, t_in: torch.Tensor) -> torch.Tensor:
            v, cnn, att = self.estimator.forward_chunk(
                x_in,
                mu_in,
                t_in,
                spks_in,
                cond_in,
                None if cnn_cache is None else cnn_cache[step],
                None if att_cache is None else att_cache[step],
            )
            new_cnn.append(cnn)
            new_att.append(att)
            return v

        x = euler_cfg(x, n_timesteps, self.inference_cfg_rate, velocity)
        return x, torch.stack(new_cnn, 0), torch.stack(new_att, 0)
