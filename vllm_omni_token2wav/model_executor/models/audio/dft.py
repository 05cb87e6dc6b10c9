# SPDX-License-Identifier: Apache-2.0
"""Power spectrum of real frames, by FFT or by a DFT matrix product.

Both feature extractors need |X_k|^2 of windowed real frames for the lower `num_bins` bins of an
`n_fft`-point DFT. Two implementations, chosen in one place (`default_dft_impl`):

| platform | impl     | why                                                                     |
| -------- | -------- | ----------------------------------------------------------------------- |
| CPU      | "fft"    | `torch.fft.rfft` (pocketfft) is exact to float32 rounding and fastest   |
| CUDA     | "fft"    | cuFFT                                                                   |
| NPU      | "matmul" | FFT operator coverage in torch_npu varies by release; a matmul with a   |
|          |          | precomputed cos/sin basis only needs GEMM, which every backend has      |

"matmul" computes X_k = sum_n x_n (cos(2 pi k n / N) - i sin(2 pi k n / N)) for the `frame_len` real
input samples (the zero padding up to `n_fft` contributes nothing, so the basis is [frame_len, num_bins]).
Its float32 error is of the same order as the FFT's (both validated against kaldi-native-fbank and
float64 references in the tests). On CUDA, TF32 matmul (`torch.backends.cuda.matmul.allow_tf32`)
would degrade the "matmul" path, which is one reason CUDA uses "fft".
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from vllm_omni_token2wav.model_executor.models.audio.constants_cache import device_constant

DftImpl = Literal["fft", "matmul"]
DFT_IMPLS: tuple[str, ...] = ("fft", "matmul")


def default_dft_impl() -> DftImpl:
    """The implementation for the current platform (table in the module docstring)."""
    from vllm_omni_token2wav import platforms

    return "matmul" if platforms.current_omni_platform.is_npu() else "fft"


def dft_basis(frame_len: int, n_fft: int, num_bins: int) -> torch.Tensor:
    """[frame_len, 2 * num_bins] float64: cos columns then -sin columns."""
    n = torch.arange(frame_len, dtype=torch.float64)[:, None]
    k = torch.arange(num_bins, dtype=torch.float64)[None, :]
    # Reduce n*k modulo n_fft in integers first: the angle stays in [0, 2 pi) and keeps full precision.
    phase = (n.long() * k.long() % n_fft).to(torch.float64) * (2.0 * math.pi / n_fft)
    return torch.cat([torch.cos(phase), -torch.sin(phase)], dim=1)


def power_spectrum(frames: torch.Tensor, n_fft: int, num_bins: int, impl: DftImpl) -> torch.Tensor:
    """|X_k|^2 for k in [0, num_bins) of `frames` [..., L] zero-padded to `n_fft` (L <= n_fft), float32."""
    frame_len = frames.shape[-1]
    if frame_len > n_fft:
        raise ValueError(f"power_spectrum: frame length {frame_len} exceeds n_fft {n_fft}")
    if not 0 < num_bins <= n_fft // 2 + 1:
        raise ValueError(f"power_spectrum: num_bins must be in [1, {n_fft // 2 + 1}], got {num_bins}")
    if impl == "fft":
        spec = torch.fft.rfft(frames, n=n_fft, dim=-1)[..., :num_bins]
        return spec.real.square() + spec.imag.square()
    if impl == "matmul":
        basis = device_constant(
            "dft_basis", (frame_len, n_fft, num_bins), frames.device, lambda: dft_basis(frame_len, n_fft, num_bins)
        )
        reim = torch.matmul(frames, basis)
        return reim[..., :num_bins].square() + reim[..., num_bins:].square()
    raise ValueError(f"power_spectrum: impl must be one of {DFT_IMPLS}, got {impl!r}")
