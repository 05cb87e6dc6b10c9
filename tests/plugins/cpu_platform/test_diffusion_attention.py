# SPDX-License-Identifier: Apache-2.0
"""The CPU omni platform's diffusion attention: upstream's SDPA layer runs on the CPU, with upstream's arithmetic.

vLLM-Omni 0.30's diffusion `Attention` dispatches its forward on the platform and has no CPU branch
(`NotImplementedError: No forward implementation for platform`), which stopped its CosyVoice3 code2wav
DiT on a CPU-only host. Under `CpuEnginePlatform` the layer resolves `CPUSDPABackend`, whose forward
is torch's SDPA with upstream's CUDA-branch mask layout: compared here with a direct SDPA call, with and
without a key-padding mask, and through upstream's own DiT attention module.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the CPU platform's diffusion attention tests")


@pytest.fixture
def cpu_omni_platform(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """`CpuEnginePlatform` as vLLM-Omni's current platform (as on a CPU-only engine host) for the test."""
    import vllm_omni.platforms as omni_platforms

    from vllm_omni_token2wav.plugins.cpu_platform.platform import CpuEnginePlatform

    platform = CpuEnginePlatform()
    monkeypatch.setattr(omni_platforms, "_current_omni_platform", platform, raising=False)
    # modules that imported the name keep their own binding: point each at the same object
    import vllm_omni.diffusion.attention.backends.abstract as abstract
    import vllm_omni.diffusion.attention.layer as layer

    for module in (abstract, layer):
        if hasattr(module, "current_omni_platform"):
            monkeypatch.setattr(module, "current_omni_platform", platform)
    from vllm_omni.diffusion.attention import selector

    monkeypatch.setattr(selector, "_cached_get_backend_cls", selector._cached_get_backend_cls.__wrapped__)
    yield platform


def _qkv(batch: int, seq: int, heads: int, head_dim: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, seq, heads, head_dim, generator=g) for _ in range(3))


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """torch SDPA on `[B, S, H, D]` inputs, a `[B, K]` key mask broadcast over heads and queries."""
    attn_mask = None if mask is None else mask[:, None, None, :]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask, scale=scale
    )
    return out.transpose(1, 2)


def test_the_platform_names_the_cpu_sdpa_backend(cpu_omni_platform: object) -> None:
    from vllm_omni.diffusion.attention.backends.sdpa import SDPABackend

    from vllm_omni_token2wav.plugins.cpu_platform.diffusion_attention import CPUSDPABackend, CPUSDPAImpl

    path = cpu_omni_platform.get_diffusion_attn_backend_cls(None, 64)  # type: ignore[attr-defined]
    assert path == f"{CPUSDPABackend.__module__}.{CPUSDPABackend.__qualname__}"
    assert issubclass(CPUSDPABackend, SDPABackend) and CPUSDPABackend.get_name() == SDPABackend.get_name()
    assert CPUSDPABackend.get_impl_cls() is CPUSDPAImpl


@pytest.mark.parametrize("masked", [False, True])
def test_the_impl_equals_torch_sdpa_with_upstreams_mask_layout(cpu_omni_platform: object, masked: bool) -> None:
    from vllm_omni.diffusion.attention.backends.abstract import AttentionMetadata

    from vllm_omni_token2wav.plugins.cpu_platform.diffusion_attention import CPUSDPAImpl

    q, k, v = _qkv(2, 37, 4, 16, seed=3)
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[1, 30:] = False  # the second row is padded: its last keys are never attended
    impl = CPUSDPAImpl(num_heads=4, head_size=16, softmax_scale=0.25)
    metadata = AttentionMetadata(attn_mask=mask) if masked else None
    got = impl.forward(q, k, v, metadata)
    want = _sdpa(q, k, v, mask if masked else None, 0.25)
    assert got.shape == want.shape == (2, 37, 4, 16)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    if masked:  # the mask mattered: padded keys changed row 1
        assert (got[1] - _sdpa(q, k, v, None, 0.25)[1]).abs().max() > 1e-3


def test_upstreams_cosyvoice3_dit_attention_runs_on_the_cpu(cpu_omni_platform: object) -> None:
    """Upstream's DiT block attention (the module its CosyVoice3 code2wav runs) through the diffusion layer."""
    from vllm_omni.diffusion.config import set_current_diffusion_config
    from vllm_omni.diffusion.data import OmniDiffusionConfig
    from vllm_omni.diffusion.models.cosyvoice3_audio.cosyvoice3_dit import DiT

    torch.manual_seed(0)
    with set_current_diffusion_config(OmniDiffusionConfig()):
        dit = DiT(dim=64, depth=1, heads=4, dim_head=16, mel_dim=80, mu_dim=80, spk_dim=80, out_channels=80).eval()
    x, mu, cond = (torch.randn(2, 80, 20) for _ in range(3))
    spks, t = torch.randn(2, 80), torch.rand(2)
    mask = torch.ones(2, 1, 20)
    with torch.inference_mode():
        out = dit(x, mask, mu, t, spks, cond)
    assert out.shape == (2, 80, 20) and bool(torch.isfinite(out).all())
