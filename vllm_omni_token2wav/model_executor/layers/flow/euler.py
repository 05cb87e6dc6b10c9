# SPDX-License-Identifier: Apache-2.0
"""The flow-matching sampler shared by every CosyVoice-family flow: cosine t-span, Euler, CFG.

Step-Audio2 / MiniCPM-o (`CausalMaskedDiffWithXvec`) and CosyVoice3 (`CausalMaskedDiffWithDiT`)
integrate `dx/dt = v(x, t)` from noise at t=0 to a mel at t=1 the same way (reference
`ConditionalCFM.solve_euler`):

    t_k = 1 - cos(k / n * pi / 2),  k = 0..n                        (cosine schedule)
    v   = (1 + r) v(x | mu, spk, cond) - r v(x | 0, 0, 0)           (classifier-free guidance, r = 0.7)
    x  += dt * v;  t += dt;  dt = t_{k+1} - t                       (t accumulated, as the reference)

Both guidance branches run as one batch `[cond rows; uncond rows]` with the same `x` and `t`. The
families differ only in the velocity function (estimator, caches, masks), which the caller passes in.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

#: velocity(step index 0..n-1, x doubled `[x; x]`, t doubled `(2B,)`) -> velocity of both branches.
Velocity = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


def cosine_t_span(n_timesteps: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """`1 - cos(linspace(0, 1, n + 1) * pi / 2)` in `dtype` (computed in that dtype, as the reference)."""
    t = torch.linspace(0, 1, n_timesteps + 1, device=device, dtype=dtype)
    return 1 - torch.cos(t * 0.5 * torch.pi)


def cfg_pair(cond_branch: torch.Tensor) -> torch.Tensor:
    """`[c; 0]` along the batch: the conditional rows, then the unconditional branch's zeroed copy.

    The unconditional branch zeroes mu, the speaker and the prompt cond; `x` and `t` are shared.
    """
    return torch.cat([cond_branch, torch.zeros_like(cond_branch)], dim=0)


def euler_cfg(x: torch.Tensor, n_timesteps: int, cfg_rate: float, velocity: Velocity) -> torch.Tensor:
    """Integrate from `x` (the noise, batch B) over the cosine schedule with CFG; returns x at t=1."""
    if n_timesteps < 1:
        raise ValueError(f"flow sampler: n_timesteps must be >= 1, got {n_timesteps}")
    t_span = cosine_t_span(n_timesteps, x.device, x.dtype)
    t, dt = t_span[0:1].expand(x.size(0)), t_span[1] - t_span[0]
    for step in range(1, len(t_span)):
        v = velocity(step - 1, torch.cat([x, x], 0), torch.cat([t, t], 0))
        v_cond, v_uncond = v.chunk(2, dim=0)
        x = x + dt * ((1.0 + cfg_rate) * v_cond - cfg_rate * v_uncond)
        t = t + dt
        if step < len(t_span) - 1:
            dt = t_span[step + 1] - t[0]
    return x
