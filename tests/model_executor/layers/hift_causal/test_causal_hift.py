# SPDX-License-Identifier: Apache-2.0
"""Causal HiFT: whole-utterance output against an independent re-statement of the reference, causality."""

from __future__ import annotations

import pytest
import torch

from tests.model_executor.layers.hift_causal.conftest import NOISE, flow_like_mel
from tests.model_executor.layers.hift_causal.reference import reference_inference, reference_noise
from vllm_omni_token2wav.model_executor.layers.hift_causal import CausalHiFTGenerator, PhaseMode
from vllm_omni_token2wav.model_executor.layers.hift_causal.source import CausalSource

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


@pytest.mark.parametrize("frames", [1, 8, 9, 37, 150])
@pytest.mark.parametrize("finalize", [True, False])
def test_inference_matches_the_reference_restatement(model: CausalHiFTGenerator, frames: int, finalize: bool) -> None:
    mel = flow_like_mel(frames, seed=frames)
    noise = reference_noise(NOISE.seed, NOISE.draws_before, frames * 480)
    with torch.inference_mode():
        ours = model.inference(mel, finalize=finalize)
    expected_len = 480 * frames if finalize else 480 * max(0, frames - 8)
    assert ours.shape == (1, expected_len)
    if finalize or frames > 8:  # the reference cannot run a non-final call on <= 8 frames
        torch.testing.assert_close(ours, reference_inference(model, mel, noise, finalize), rtol=0, atol=1e-6)
    if finalize:
        assert ours.abs().max() > 1e-3 and torch.isfinite(ours).all()


def test_non_final_output_is_the_prefix_of_the_final_one(model: CausalHiFTGenerator) -> None:
    mel = flow_like_mel(40, seed=1)
    with torch.inference_mode():
        final = model.inference(mel)
        partial = model.inference(mel, finalize=False)
    assert partial.shape == (1, 480 * 32)
    torch.testing.assert_close(partial, final[:, : partial.shape[1]], rtol=0, atol=1e-6)


def test_a_mel_frame_never_changes_audio_more_than_five_frames_before_it(model: CausalHiFTGenerator) -> None:
    """Causality with a bounded look-ahead: conv_pre reads 4 frames ahead, the iSTFT one more."""
    mel = flow_like_mel(30, seed=2)
    changed = mel.clone()
    j = 20
    changed[:, :, j] += 2.0
    with torch.inference_mode():
        a, b = model.inference(mel), model.inference(changed)
    assert torch.equal(a[:, : 480 * (j - 5)], b[:, : 480 * (j - 5)])
    assert not torch.equal(a[:, 480 * (j - 5) : 480 * (j + 1)], b[:, 480 * (j - 5) : 480 * (j + 1)])


def test_batch_rows_are_vocoded_independently(model: CausalHiFTGenerator) -> None:
    mel = flow_like_mel(24, seed=4, batch=2)
    with torch.inference_mode():
        both = model.inference(mel)
        rows = [model.inference(mel[i : i + 1]) for i in range(2)]
    torch.testing.assert_close(both, torch.cat(rows), rtol=0, atol=1e-6)


def test_wrapped_phase_is_the_float64_phase_mod_one(model: CausalHiFTGenerator) -> None:
    """minicpmo-utils' numerics: sin(2 pi frac(480 * sum of increments)) in float64, then float32."""
    source: CausalSource = model.m_source
    f0 = torch.tensor([[0.0, 97.5, 180.25, 5.0, 240.0, 333.3, 120.0]]).repeat(1, 9)  # 63 frames
    phase = source.initial_phase(1, "cpu")
    sines, end = source.frame_sines(f0, phase, PhaseMode.WRAPPED_FP64, block_frames=16)
    inc = torch.remainder(f0.double()[..., None] * torch.arange(1, 10, dtype=torch.float64) / 24000, 1.0)
    inc = inc.float().double()  # the increments are float32 values in both references
    cycles = torch.cumsum(inc, dim=1) * 480
    expected = (torch.sin(2 * torch.pi * torch.remainder(cycles, 1.0)) * 0.1).float()
    torch.testing.assert_close(sines, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(end, torch.remainder(cycles[:, -1], 1.0), rtol=0, atol=1e-9)
    assert ((end >= 0) & (end < 1)).all()
    # Short utterance: the float32 cumulative phase has not drifted yet, both modes agree closely.
    cumulative, _ = source.frame_sines(f0[:, :8], phase, PhaseMode.CUMULATIVE_FP32)
    torch.testing.assert_close(cumulative, sines[:, :8], rtol=0, atol=1e-4)
