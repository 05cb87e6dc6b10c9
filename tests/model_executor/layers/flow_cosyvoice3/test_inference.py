# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3 flow, whole utterance: equal to the independent reference, the quirks one by one, bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.model_executor.layers.flow.inputs import make_prompt, make_tokens
from tests.model_executor.layers.flow_cosyvoice3.reference import reference_mel
from vllm_omni_token2wav.model_executor.layers.flow.pre_lookahead import PreLookaheadLayer
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import (
    REDUCED_FLOW_CONFIG,
    CausalMaskedDiffWithDiT,
    align_prompt,
    noise_table,
)
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.dit import (
    CausalConvPositionEmbedding,
    FinalLayer,
    RotaryEmbedding,
    apply_rotary,
    block_causal_mask,
    sinus_time_embedding,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

ATOL = 1e-5
N_STEPS = 3


@pytest.mark.parametrize(("streaming", "finalize"), [(False, True), (True, True), (True, False), (False, False)])
def test_whole_utterance_equals_the_independent_reference(
    cv3_flow: CausalMaskedDiffWithDiT, cv3_weights: dict[str, torch.Tensor], streaming: bool, finalize: bool
) -> None:
    pt, pm, spk = make_prompt(19)
    tok = make_tokens(47)
    mel = cv3_flow.inference(tok, 47, pt, 19, pm, 38, spk, streaming=streaming, finalize=finalize, n_timesteps=N_STEPS)
    ref = reference_mel(
        cv3_weights,
        REDUCED_FLOW_CONFIG,
        prompt_ids=pt,
        prompt_mel=pm,
        embedding=spk,
        ids=tok,
        noise=noise_table(0),
        n_timesteps=N_STEPS,
        streaming=streaming,
        finalize=finalize,
    )
    assert mel.shape == (1, 80, 2 * (47 if finalize else 44)) and mel.dtype == torch.float32
    torch.testing.assert_close(mel, ref, atol=ATOL, rtol=0)


def test_full_and_block_causal_attention_differ_and_the_prompt_steers_the_output(
    cv3_flow: CausalMaskedDiffWithDiT,
) -> None:
    pt, pm, spk = make_prompt(30)
    tok = make_tokens(70)
    full = cv3_flow.inference(tok, 70, pt, 30, pm, 60, spk, streaming=False, n_timesteps=2)
    block = cv3_flow.inference(tok, 70, pt, 30, pm, 60, spk, streaming=True, n_timesteps=2)
    assert (full - block).abs().max() > 1e-3
    other = cv3_flow.inference(tok, 70, pt, 30, pm + 1.0, 60, spk, streaming=False, n_timesteps=2)
    assert (full - other).abs().max() > 1e-3


def test_noise_seed_selects_the_table_and_explicit_noise_replaces_it(cv3_flow: CausalMaskedDiffWithDiT) -> None:
    pt, pm, spk = make_prompt(10)
    tok = make_tokens(20)
    a = cv3_flow.inference(tok, 20, pt, 10, pm, 20, spk, n_timesteps=2)
    b = cv3_flow.inference(tok, 20, pt, 10, pm, 20, spk, n_timesteps=2, noise=noise_table(0).clone())
    c = cv3_flow.inference(tok, 20, pt, 10, pm, 20, spk, n_timesteps=2, noise_seed=3)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


def test_negative_ids_are_clamped_to_zero_like_the_reference_padding(cv3_flow: CausalMaskedDiffWithDiT) -> None:
    pt, pm, spk = make_prompt(6)
    tok = make_tokens(12)
    tok[0, 4] = -1
    zero = tok.clone()
    zero[0, 4] = 0
    a = cv3_flow.inference(tok, 12, pt, 6, pm, 12, spk, n_timesteps=1)
    b = cv3_flow.inference(zero, 12, pt, 6, pm, 12, spk, n_timesteps=1)
    assert torch.equal(a, b)


def test_bad_input_is_an_error_naming_the_problem(cv3_flow: CausalMaskedDiffWithDiT) -> None:
    pt, pm, spk = make_prompt(12)
    tok = make_tokens(10)
    f = cv3_flow.inference
    with pytest.raises(ValueError, match=r"tokens ids span \[\d+, 6561\], allowed"):
        f(torch.cat([tok, torch.tensor([[6561]])], 1), 11, pt, 12, pm, 24, spk)
    with pytest.raises(ValueError, match="0 generated tokens"):
        f(tok[:, :0], 0, pt, 12, pm, 24, spk)
    with pytest.raises(ValueError, match=r"3 generated tokens; need .* 4 \(finalize=False"):
        f(tok[:, :3], 3, pt, 12, pm, 24, spk, finalize=False)
    with pytest.raises(ValueError, match="prompt_mel has 23 frames but 12 prompt tokens need 24.*align_prompt"):
        f(tok, 10, pt, 12, pm[:, :23], 23, spk)
    with pytest.raises(ValueError, match="token_len=9 but the tensor holds 10"):
        f(tok, 9, pt, 12, pm, 24, spk)
    with pytest.raises(ValueError, match="batch 2"):
        f(tok.repeat(2, 1), 10, pt, 12, pm, 24, spk)
    with pytest.raises(ValueError, match="speaker embedding has 80 dims, expected 192"):
        f(tok, 10, pt, 12, pm, 24, spk[:, :80])
    with pytest.raises(ValueError, match="integer tensor"):
        f(tok.float(), 10, pt, 12, pm, 24, spk)
    with pytest.raises(ValueError, match="n_timesteps must be >= 1"):
        f(tok, 10, pt, 12, pm, 24, spk, n_timesteps=0)


def test_a_prompt_too_long_for_the_noise_table_is_a_clear_error(cv3_flow: CausalMaskedDiffWithDiT) -> None:
    pt, pm, spk = make_prompt(12)
    tok = make_tokens(10)
    short = noise_table(0)[:, :, :40]
    with pytest.raises(ValueError, match=r"44 mel frames .* noise table holds 40"):
        cv3_flow.inference(tok, 10, pt, 12, pm, 24, spk, noise=short)


def test_align_prompt_truncates_to_two_frames_per_token() -> None:
    tokens, mel = torch.arange(10)[None], torch.zeros(1, 23, 80)
    t, m = align_prompt(tokens, mel)
    assert t.shape == (1, 10) and m.shape == (1, 20, 80)
    t, m = align_prompt(tokens, torch.zeros(1, 17, 80))
    assert t.shape == (1, 8) and m.shape == (1, 16, 80) and torch.equal(t, tokens[:, :8])


# ---------------------------------------------------------------- the quirks, one formula each


def test_time_embedding_is_sin_then_cos_with_frequencies_over_127() -> None:
    t = torch.tensor([0.0, 0.37, 1.0])
    got = sinus_time_embedding(t)
    i = torch.arange(128, dtype=torch.float64)
    arg = 1000 * t.double()[:, None] * torch.exp(-math.log(10000) * i / 127)[None]
    # float32 arguments up to 1000 rad carry ~1e-4 rad of rounding; /128 or [cos|sin] would be off by O(1)
    torch.testing.assert_close(got.double(), torch.cat([arg.sin(), arg.cos()], 1), atol=3e-4, rtol=0)


def test_rope_rotates_interleaved_pairs_of_the_first_dim_head_channels_only() -> None:
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(7, 12)
    angles = RotaryEmbedding(16).angles(positions)
    got = apply_rotary(x, angles)
    assert torch.equal(got[..., 16:], x[..., 16:]), "heads after head 0 are not rotated"
    inv = 10000.0 ** (-torch.arange(0, 16, 2).float() / 16)
    theta = positions[:, None].float() * inv[None]
    even, odd = x[..., 0:16:2], x[..., 1:16:2]
    torch.testing.assert_close(got[..., 0:16:2], even * theta.cos() - odd * theta.sin(), atol=1e-6, rtol=0)
    torch.testing.assert_close(got[..., 1:16:2], odd * theta.cos() + even * theta.sin(), atol=1e-6, rtol=0)


def test_final_layer_chunks_are_scale_then_shift() -> None:
    layer = FinalLayer(8)
    with torch.no_grad():
        layer.linear.weight.zero_()
        layer.linear.bias.copy_(torch.cat([torch.full((8,), 2.0), torch.full((8,), 5.0)]))  # scale 2, shift 5
    x = torch.randn(1, 3, 8, generator=torch.Generator().manual_seed(1))
    normed = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-6)
    torch.testing.assert_close(layer(x, torch.zeros(1, 8)), normed * 3.0 + 5.0, atol=1e-5, rtol=0)


def test_conv_position_embedding_is_causal_and_streams_with_history() -> None:
    conv = CausalConvPositionEmbedding(32).eval()
    x = torch.randn(2, 70, 32, generator=torch.Generator().manual_seed(2))
    whole, _ = conv(x)
    first, (in1, in2) = conv(x[:, :40])
    rest, _ = conv(x[:, 40:], (in1[..., -30:], in2[..., -30:]))
    torch.testing.assert_close(torch.cat([first, rest], 1), whole, atol=1e-6, rtol=0)
    changed, _ = conv(torch.cat([x[:, :50], x[:, 50:] + 1], 1))
    assert torch.equal(changed[:, :50], whole[:, :50]), "no frame sees the future"


def test_pre_lookahead_window_equals_the_whole_sequence_on_every_span() -> None:
    layer = PreLookaheadLayer(16, 3, in_channels=6)
    x = torch.randn(1, 20, 6, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        whole = layer(x)
        # reference formula: conv1 over x + 3 zero frames, zero conv1 outputs before the start, conv2, residual
        y = F.leaky_relu(layer.conv1(F.pad(x.transpose(1, 2), (0, 3))))
        ref = layer.conv2(F.pad(y, (2, 0))).transpose(1, 2) + x
        torch.testing.assert_close(whole, ref, atol=1e-6, rtol=0)
        for a, b in [(0, 5), (1, 9), (2, 17), (6, 17), (15, 20)]:
            history = min(2, a)
            end = min(20, b + 3)
            got = layer.forward_window(x[:, a - history : end], history=history, lookahead_pad=3 - (end - b))
            torch.testing.assert_close(got, whole[:, a:b], atol=1e-6, rtol=0)


def test_block_causal_mask_sees_its_chunk_and_all_earlier_ones() -> None:
    mask = block_causal_mask(7, 3, torch.device("cpu"))
    rows = [[int(v) for v in row] for row in mask]
    assert rows[0] == [1, 1, 1, 0, 0, 0, 0] and rows[4] == [1, 1, 1, 1, 1, 1, 0] and rows[6] == [1] * 7
