# SPDX-License-Identifier: Apache-2.0
"""Whole-utterance inference: output contract, determinism with a fixed noise buffer, input validation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.model_executor.layers.flow.inputs import make_prompt, make_tokens
from vllm_omni_token2wav.model_executor.layers.flow import CausalMaskedDiffWithXvec, load_flow

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def _run(model: CausalMaskedDiffWithXvec, tokens: torch.Tensor, n_prompt: int = 12, n_timesteps: int = 4, **over):
    p_tok, p_mel, spk = make_prompt(n_prompt)
    args = {
        "token": tokens,
        "token_len": torch.tensor([tokens.size(1)]),
        "prompt_token": p_tok,
        "prompt_token_len": torch.tensor([p_tok.size(1)]),
        "prompt_feat": p_mel,
        "prompt_feat_len": torch.tensor([p_mel.size(1)]),
        "embedding": spk,
        "n_timesteps": n_timesteps,
    }
    args.update(over)
    return model.inference(**args)


def test_inference_returns_two_mel_frames_per_generated_token(reduced_flow: CausalMaskedDiffWithXvec) -> None:
    mel = _run(reduced_flow, make_tokens(15))
    assert mel.shape == (1, 80, 30)
    assert mel.dtype == torch.float32 and bool(torch.isfinite(mel).all())


def test_output_is_the_part_after_the_prompt_of_the_sampled_mel(reduced_flow: CausalMaskedDiffWithXvec) -> None:
    """Replace the sampler by a recorder: the decoder sees the prompt mel as cond and the output drops P frames."""
    seen = {}
    decoder = reduced_flow.decoder
    original = decoder.forward

    def record(mu, mask, spks, cond, n_timesteps=10, temperature=1.0):  # noqa: ANN001, ANN202
        seen.update(mu=mu, cond=cond, mask=mask)
        return torch.arange(mu.size(2), dtype=mu.dtype).expand(1, 80, -1)

    decoder.forward = record  # type: ignore[method-assign]
    try:
        mel = _run(reduced_flow, make_tokens(5), n_prompt=4)
    finally:
        decoder.forward = original  # type: ignore[method-assign]
    p_tok, p_mel, _ = make_prompt(4)
    assert seen["mu"].shape == (1, 80, 18)
    torch.testing.assert_close(seen["cond"][0, :, :8], p_mel[0].T)
    assert torch.all(seen["cond"][0, :, 8:] == 0) and bool(seen["mask"].all())
    torch.testing.assert_close(mel[0, 0], torch.arange(8, 18, dtype=torch.float32))


def test_inference_is_deterministic_for_a_fixed_noise_buffer(reduced_flow_files: tuple[Path, Path]) -> None:
    a = load_flow(reduced_flow_files, device="cpu", noise_seed=0)
    b = load_flow(reduced_flow_files, device="cpu", noise_seed=5)
    tokens = make_tokens(10)
    out_a, out_b = _run(a, tokens), _run(b, tokens)
    assert not torch.allclose(out_a, out_b), "the noise must matter"
    b.decoder.set_noise(a.decoder.rand_noise)
    torch.testing.assert_close(_run(b, tokens), out_a, atol=0, rtol=0)
    torch.testing.assert_close(_run(a, tokens), out_a, atol=0, rtol=0)


def test_negative_token_ids_are_clamped_to_zero_as_the_reference(reduced_flow: CausalMaskedDiffWithXvec) -> None:
    tokens = make_tokens(8)
    padded, zeroed = tokens.clone(), tokens.clone()
    padded[0, 5:] = -1
    zeroed[0, 5:] = 0
    torch.testing.assert_close(_run(reduced_flow, padded), _run(reduced_flow, zeroed), atol=0, rtol=0)


def test_bad_inputs_are_rejected_with_a_clear_error(reduced_flow: CausalMaskedDiffWithXvec) -> None:
    tokens = make_tokens(6)
    with pytest.raises(ValueError, match=r"tokens ids span \[\d+, 6561\]"):
        _run(reduced_flow, torch.cat([tokens, torch.tensor([[6561]])], dim=1))
    _, p_mel, spk = make_prompt(12)
    with pytest.raises(ValueError, match="prompt_mel has 23 frames but 12 prompt tokens need 24"):
        _run(reduced_flow, tokens, prompt_feat=p_mel[:, :23], prompt_feat_len=torch.tensor([23]))
    with pytest.raises(ValueError, match="prompt_mel_len=20 but the tensor holds 24"):
        _run(reduced_flow, tokens, prompt_feat_len=torch.tensor([20]))
    with pytest.raises(ValueError, match="token_len=5"):
        _run(reduced_flow, tokens, token_len=torch.tensor([5]))
    with pytest.raises(ValueError, match="batch 2"):
        _run(reduced_flow, tokens.repeat(2, 1), token_len=torch.tensor([6, 6]))
    with pytest.raises(ValueError, match="speaker embedding has 80 dims, expected 192"):
        _run(reduced_flow, tokens, embedding=spk[:, :80])
    with pytest.raises(ValueError, match=r"expected \(1, T, 80\)"):
        _run(reduced_flow, tokens, prompt_feat=p_mel.transpose(1, 2))
    with pytest.raises(ValueError, match="integer tensor"):
        _run(reduced_flow, tokens.float())


def test_float16_model_tracks_the_float32_model(reduced_flow_files: tuple[Path, Path]) -> None:
    fp32 = load_flow(reduced_flow_files, device="cpu")
    fp16 = load_flow(reduced_flow_files, device="cpu", float16=True)
    tokens = make_tokens(10)
    ref, half = _run(fp32, tokens), _run(fp16, tokens)
    assert half.dtype == torch.float16
    assert (half.float() - ref).abs().max() < 0.05 * ref.abs().max()
