# SPDX-License-Identifier: Apache-2.0
"""Input checks shared by the flow models: speech tokens, prompt mel, speaker embedding, lengths.

Both flows (Step-Audio2's `CausalMaskedDiffWithXvec`, CosyVoice3's `CausalMaskedDiffWithDiT`) take the
reference's batch-1 tensors. A wrong input would otherwise surface as an index error deep in an
embedding, a silently shifted prompt or a shape crash inside the estimator; these checks name the
tensor, what was expected and the likely fix. Every message starts with `flow.<entry point>:`.
"""

from __future__ import annotations

import torch


def check_batch1(name: str, x: torch.Tensor, dims: int, where: str) -> None:
    """`x` is a `dims`-D tensor with batch 1 (the reference asserts batch 1)."""
    if not isinstance(x, torch.Tensor) or x.dim() != dims:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"flow.{where}: {name} must be a {dims}-D tensor, got {shape}")
    if x.size(0) != 1:
        raise ValueError(f"flow.{where}: {name} has batch {x.size(0)}; the flow model runs batch 1 (as the reference)")


def check_length(name: str, length: torch.Tensor | int, want: int, where: str) -> None:
    """A reference-style `*_len` argument equals the tensor's time dimension (batch 1 has no padding)."""
    got = int(length.reshape(-1)[0]) if isinstance(length, torch.Tensor) else int(length)
    if got != want:
        raise ValueError(
            f"flow.{where}: {name}={got} but the tensor holds {want} frames; batch-1 inputs carry no padding, "
            "so the length must equal the tensor's time dimension"
        )


def speech_tokens(
    tokens: torch.Tensor,
    name: str,
    where: str,
    *,
    vocab_size: int,
    device: torch.device,
    clamp_negative: bool,
) -> torch.Tensor:
    """`(1, T)` integer ids as long on `device`; ids >= vocab_size (and < 0 unless clamped to 0) are errors.

    The id range is checked where the ids can be read without a device round trip: ids given on the
    host (lists, the stage's chunks, CPU tensors) are checked before the non-blocking copy. Ids that
    are already on an accelerator were made there (the speech tokenizer's FSQ codes are
    0..vocab_size - 1 by construction) and are not read back: that would stall the device queue.
    """
    check_batch1(name, tokens, 2, where)
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(f"flow.{where}: {name} must be an integer tensor, got {tokens.dtype}")
    if tokens.numel() and tokens.device.type == "cpu":
        lo, hi = (int(v) for v in torch.stack(torch.aminmax(tokens)).tolist())
        if hi >= vocab_size or (lo < 0 and not clamp_negative):
            allowed = f"[0, {vocab_size})" if not clamp_negative else f"(-inf, {vocab_size})"
            raise ValueError(
                f"flow.{where}: {name} ids span [{lo}, {hi}], allowed {allowed}; speech tokens of the 25 Hz "
                f"tokenizer are 0..{vocab_size - 1}"
            )
    tokens = tokens.to(device=device, dtype=torch.long, non_blocking=True)
    return tokens.clamp(min=0) if clamp_negative else tokens


def mel_frames(
    mel: torch.Tensor, name: str, where: str, *, bins: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """`(1, T, bins)` mel (frames first) on `device` in `dtype`."""
    check_batch1(name, mel, 3, where)
    if mel.size(2) != bins:
        raise ValueError(
            f"flow.{where}: {name} has shape {tuple(mel.shape)}, expected (1, T, {bins}) "
            f"(frames first, {bins} mel bins last)"
        )
    return mel.to(device=device, dtype=dtype)


def speaker_embedding(
    spk: torch.Tensor, where: str, *, dims: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """`(1, dims)` CAM++ embedding on `device` in `dtype` (not yet normalised or projected)."""
    check_batch1("spk_emb", spk, 2, where)
    if spk.size(1) != dims:
        raise ValueError(f"flow.{where}: speaker embedding has {spk.size(1)} dims, expected {dims} (CAM++ output)")
    return spk.to(device=device, dtype=dtype)
