# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3's flow-matching decoder (reference `CausalConditionalCFM`): the DiT under the shared Euler/CFG loop.

The module exists for the checkpoint layout (`decoder.estimator.*`) and to hold the guidance rate.
Sampling is the shared `cosyvoice2.flow.euler.euler_cfg` (cosine t-span, Euler, CFG 0.7 with the
unconditional branch's mu, speaker and cond zeroed); what CosyVoice3 adds is the starting noise
(`noise.py`: a fixed table sliced from frame 0, not a buffer of this module) and the estimator's
`streaming` flag (block-causal mask).
"""

from __future__ import annotations

import torch
from torch import nn

from vllm_omni_token2wav.model_executor.layers.flow.euler import cfg_pair, euler_cfg
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.dit import DiT


class CausalConditionalCFM(nn.Module):
    def __init__(self, estimator: DiT, inference_cfg_rate: float) -> None:
        super().__init__()
        self.estimator = estimator
        self.inference_cfg_rate = float(inference_cfg_rate)

    @torch.inference_mode()
    def forward(
        self,
        noise: torch.Tensor,
        mu: torch.Tensor,
        mask: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        n_timesteps: int = 10,
        streaming: bool = False,
    ) -> torch.Tensor:
        """noise, mu, cond `(B, 80, T)`, mask `(B, 1, T)`, spks `(B, 80)` -> mel `(B, 80, T)`."""
        mask_in = torch.cat([mask, mask], dim=0)
        mu_in, spks_in, cond_in = cfg_pair(mu), cfg_pair(spks), cfg_pair(cond)

        def velocity(step: int, x_in: torch.Tensor, t_in: torch.Tensor) -> torch.Tensor:
            return self.estimator(x_in, mask_in, mu_in, t_in, spks_in, cond_in, streaming=streaming)

        return euler_cfg(noise, n_timesteps, self.inference_cfg_rate, velocity)
