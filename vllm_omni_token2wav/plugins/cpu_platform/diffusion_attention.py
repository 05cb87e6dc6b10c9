# SPDX-License-Identifier: Apache-2.0
"""vLLM-Omni's diffusion attention (torch SDPA) with a CPU forward, for the CPU omni platform.

vLLM-Omni 0.30's diffusion `Attention` layer (used by its CosyVoice3 code2wav DiT, among others)
runs the backend the platform names; every backend's `AttentionImpl.forward` dispatches on the
platform (ROCm, CUDA, NPU, XPU, MUSA) and raises `NotImplementedError: No forward implementation
for platform: ...` on any other, CPU included, even for the portable torch SDPA backend. So on a
CPU-only host upstream's CosyVoice3 code2wav stage could be built and loaded but not run.

`CPUSDPABackend` is upstream's SDPA backend whose implementation, `CPUSDPAImpl`, answers `forward`
with the same SDPA call upstream's CUDA branch makes (`torch.nn.functional.scaled_dot_product_attention`,
a 2-D key-padding mask broadcast as `[B, 1, 1, K]`), so the arithmetic is upstream's own.
`CpuEnginePlatform.get_diffusion_attn_backend_cls` names it; only that platform uses it.
"""

from __future__ import annotations

import torch
from vllm_omni.diffusion.attention.backends.abstract import AttentionMetadata
from vllm_omni.diffusion.attention.backends.sdpa import SDPABackend, SDPAImpl

__all__ = ["CPUSDPABackend", "CPUSDPAImpl"]


class CPUSDPAImpl(SDPAImpl):
    """Upstream's SDPA implementation, answering `forward` on the CPU as its CUDA branch does."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_metadata: AttentionMetadata | None = None,
    ) -> torch.Tensor:
        return self._forward_impl(query, key, value, attn_metadata, mask_mode="broadcast_k")


class CPUSDPABackend(SDPABackend):
    """Upstream's SDPA backend (same name and capabilities) with `CPUSDPAImpl` as its implementation."""

    @staticmethod
    def get_impl_cls() -> type[SDPAImpl]:
        return CPUSDPAImpl
