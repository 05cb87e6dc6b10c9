# SPDX-License-Identifier: Apache-2.0
"""Each flow component against an independent small reference written here (fp32 CPU, 1e-6 unless noted)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vllm_omni_token2wav.model_executor.layers.flow import CausalMaskedDiffWithXvec
from vllm_omni_token2wav.model_executor.layers.flow.cfm import CausalConditionalCFM, cosine_t_span
from vllm_omni_token2wav.model_executor.layers.flow.dit import (
    CausalConv1d,
    CausalConvBlock,
    DiTBlock,
    timestep_embedding,
)
from vllm_omni_token2wav.model_executor.layers.flow.encoder import (
    ConformerEncoderLayer,
    PositionwiseFeedForward,
    PreLookaheadLayer,
    RelPositionMultiHeadedAttention,
    Upsample1D,
    rel_shift,
    relative_position_table,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

ATOL = 1e-6


def _rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _randomize(module: nn.Module, seed: int, scale: float = 0.3) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return module.eval()


# ---------------------------------------------------------------- relative positions


@pytest.mark.parametrize(("t1", "t2"), [(7, 7), (3, 9), (5, 12), (1, 4)])
def test_rel_shift_equals_the_direct_gather_of_the_padded_rows(t1: int, t2: int) -> None:
    x = _rand(2, 3, t1, 2 * t2 - 1)
    width = 2 * t2 - 1
    want = torch.zeros(2, 3, t1, t2)
    for i in range(t1):
        for j in range(t2):
            n = t1 + i * width + j  # flat index into rows of length width + 1 with a zero in front
            r, c = divmod(n, width + 1)
            want[:, :, i, j] = 0.0 if c == 0 else x[:, :, r, c - 1]
    torch.testing.assert_close(rel_shift(x), want, atol=0, rtol=0)
    if t1 == t2:  # the square case is the textbook relative shift: key j of query i at position i - j
        square = torch.stack([x[:, :, i, t1 - 1 - i : 2 * t1 - 1 - i] for i in range(t1)], dim=2)
        torch.testing.assert_close(rel_shift(x), square, atol=0, rtol=0)


def test_relative_position_table_matches_the_espnet_construction_and_closed_form() -> None:
    max_len, d = 50, 16
    table = relative_position_table(max_len, d)
    # ESPnet's construction: positive half flipped, then the negative half without position 0.
    pos = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * -(math.log(10000.0) / d))
    plus, minus = torch.zeros(max_len, d), torch.zeros(max_len, d)
    plus[:, 0::2], plus[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
    minus[:, 0::2], minus[:, 1::2] = torch.sin(-pos * div), torch.cos(-pos * div)
    espnet = torch.cat([torch.flip(plus, [0]), minus[1:]], dim=0).unsqueeze(0)
    torch.testing.assert_close(table, espnet, atol=ATOL, rtol=0)
    # closed form in float64: row m is relative position max_len - 1 - m
    r = (max_len - 1 - np.arange(2 * max_len - 1))[:, None].astype(np.float64)
    w = np.exp(-np.arange(0, d, 2) * math.log(10000.0) / d)[None, :]
    np.testing.assert_allclose(table[0, :, 0::2].numpy(), np.sin(r * w), atol=1e-5)
    np.testing.assert_allclose(table[0, :, 1::2].numpy(), np.cos(r * w), atol=1e-5)


def _conformer_layer(d: int = 16, heads: int = 2, seed: int = 0) -> ConformerEncoderLayer:
    layer = ConformerEncoderLayer(
        d, RelPositionMultiHeadedAttention(heads, d, 0.0), PositionwiseFeedForward(d, 32, 0.0), 0.0
    )
    return _randomize(layer, seed)


def test_conformer_layer_equals_an_explicit_relative_position_score_loop() -> None:
    d, heads, t = 16, 2, 6
    layer = _conformer_layer(d, heads)
    att = layer.self_attn
    x = _rand(1, t, d, seed=1)
    table = relative_position_table(t, d)  # rows: relative positions t-1 .. -(t-1)
    got, cache = layer(x, None, table)

    def ln(v: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        v64 = v.double()
        mu, var = v64.mean(-1, keepdim=True), v64.var(-1, unbiased=False, keepdim=True)
        return (v64 - mu) / torch.sqrt(var + norm.eps) * norm.weight.double() + norm.bias.double()

    def lin(v: torch.Tensor, m: nn.Linear) -> torch.Tensor:
        out = v @ m.weight.double().T
        return out + m.bias.double() if m.bias is not None else out

    h = ln(x[0], layer.norm_mha)
    dk = d // heads
    q, k, v = (lin(h, m).view(t, heads, dk) for m in (att.linear_q, att.linear_k, att.linear_v))
    p = lin(table[0].double(), att.linear_pos).view(2 * t - 1, heads, dk)
    u, bv = att.pos_bias_u.double(), att.pos_bias_v.double()
    out = torch.zeros(t, heads, dk, dtype=torch.float64)
    for hh in range(heads):
        scores = torch.zeros(t, t, dtype=torch.float64)
        for i in range(t):
            for j in range(t):
                rel_row = (t - 1) - (i - j)  # table row of relative position i - j
                scores[i, j] = ((q[i, hh] + u[hh]) @ k[j, hh] + (q[i, hh] + bv[hh]) @ p[rel_row, hh]) / math.sqrt(dk)
        out[:, hh] = torch.softmax(scores, dim=-1) @ v[:, hh]
    y = x[0].double() + lin(out.reshape(t, d), att.linear_out)
    ff = layer.feed_forward
    y = y + lin(F.silu(lin(ln(y, layer.norm_ff), ff.w_1)), ff.w_2)
    torch.testing.assert_close(got[0].double(), y, atol=1e-5, rtol=0)
    assert cache.shape == (1, heads, t, 2 * dk)
    torch.testing.assert_close(cache[0, :, :, :dk].double(), k.transpose(0, 1), atol=1e-5, rtol=0)


def test_conformer_padding_mask_hides_padded_keys() -> None:
    layer = _conformer_layer()
    x = _rand(1, 6, 16, seed=2)
    table = relative_position_table(6, 16)
    mask = torch.tensor([[[True] * 4 + [False] * 2]])
    masked, _ = layer(x, mask, table)
    changed = x.clone()
    changed[:, 4:] += 5.0
    masked2, _ = layer(changed, mask, table)
    torch.testing.assert_close(masked[:, :4], masked2[:, :4], atol=ATOL, rtol=0)


# ---------------------------------------------------------------- DiT pieces


def test_timestep_embedding_is_cos_then_sin_of_the_glide_frequencies() -> None:
    t = torch.tensor([0.0, 0.00025, 0.001, 0.25, 0.5, 0.97, 1.0]) * 1000
    got = timestep_embedding(t, 256).double().numpy()
    freqs = np.exp(-math.log(10000.0) * np.arange(128, dtype=np.float64) / 128)
    args = t.double().numpy()[:, None] * freqs[None, :]
    want = np.concatenate([np.cos(args), np.sin(args)], axis=1)
    # float32 rounds the argument t * f (relative 2^-24 each for f and the product): allow that, plus 1e-6
    tol = ATOL + np.concatenate([np.abs(args), np.abs(args)], axis=1) * 2.5e-7
    assert np.all(np.abs(got - want) <= tol)
    assert timestep_embedding(t, 7).shape == (7, 7)
    assert torch.all(timestep_embedding(t, 7)[:, -1] == 0)


def test_causal_conv_left_pads_with_zeros_and_streams_with_its_cache() -> None:
    conv = _randomize(CausalConv1d(3, 4, 3, dtype=torch.float32), 3)
    x = _rand(1, 3, 10, seed=4)
    w, b = conv.weight.detach().double().numpy(), conv.bias.detach().double().numpy()
    xp = np.concatenate([np.zeros((3, 2)), x[0].double().numpy()], axis=1)
    want = np.stack([np.einsum("oik,ik->o", w, xp[:, i : i + 3]) + b for i in range(10)], axis=1)
    np.testing.assert_allclose(conv(x)[0].detach().numpy(), want, atol=1e-5)
    first, cache = conv.forward_chunk(x[..., :4])
    second, _ = conv.forward_chunk(x[..., 4:], cache)
    torch.testing.assert_close(torch.cat([first, second], dim=2), conv(x), atol=ATOL, rtol=0)


def test_causal_conv_block_in_chunks_equals_the_whole_sequence() -> None:
    block = _randomize(CausalConvBlock(8, 8, 3), 5)
    x = _rand(2, 11, 8, seed=6)
    a, cache = block.forward_chunk(x[:, :3])
    b, cache = block.forward_chunk(x[:, 3:8], cache)
    c, _ = block.forward_chunk(x[:, 8:], cache)
    torch.testing.assert_close(torch.cat([a, b, c], dim=1), block(x), atol=ATOL, rtol=0)


def test_dit_block_equals_a_functional_reference_of_its_formula() -> None:
    hidden, heads, hd, t = 16, 2, 8, 5
    block = _randomize(DiTBlock(hidden, heads, hd, 2.0), 7)
    x = _rand(1, t, hidden, seed=8)
    c = _rand(1, 1, hidden, seed=9)
    got = block(x, c, None)
    sd = {k: v.double() for k, v in block.state_dict().items()}
    x64, c64 = x.double(), c.double()

    def lin(v: torch.Tensor, name: str) -> torch.Tensor:
        return v @ sd[f"{name}.weight"].T + sd[f"{name}.bias"]

    def ln(v: torch.Tensor, eps: float, name: str | None = None) -> torch.Tensor:
        out = (v - v.mean(-1, keepdim=True)) / torch.sqrt(v.var(-1, unbiased=False, keepdim=True) + eps)
        return out * sd[f"{name}.weight"] + sd[f"{name}.bias"] if name else out

    mod = lin(F.silu(c64), "adaLN_modulation.1").chunk(9, dim=-1)
    s_msa, sc_msa, g_msa, s_mlp, sc_mlp, g_mlp, s_conv, sc_conv, g_conv = mod
    h = ln(x64, 1e-6) * (1 + sc_msa) + s_msa
    q = ln(lin(h, "attn.to_q").view(t, heads, hd), 1e-5, "attn.q_norm")
    k = ln(lin(h, "attn.to_k").view(t, heads, hd), 1e-5, "attn.k_norm")
    v = lin(h, "attn.to_v").view(t, heads, hd)
    attn = torch.softmax(torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(hd), dim=-1)
    y = x64 + g_msa * lin(torch.einsum("hij,jhd->ihd", attn, v).reshape(1, t, heads * hd), "attn.proj")
    h = (ln(y, 1e-6) * (1 + sc_conv) + s_conv).transpose(1, 2)
    h = F.conv1d(F.pad(h, (2, 0)), sd["conv.block.1.weight"], sd["conv.block.1.bias"]).transpose(1, 2)
    h = ln(h, 1e-5, "conv.block.3")
    h = h * torch.tanh(F.softplus(h))  # Mish
    h = F.conv1d(F.pad(h.transpose(1, 2), (2, 0)), sd["conv.block.6.weight"], sd["conv.block.6.bias"])
    y = y + g_conv * h.transpose(1, 2)
    h = lin(ln(y, 1e-6) * (1 + sc_mlp) + s_mlp, "mlp.fc1")
    h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))  # GELU(tanh)
    y = y + g_mlp * lin(h, "mlp.fc2")
    torch.testing.assert_close(got.double(), y, atol=1e-5, rtol=0)


def test_dit_chunk_path_without_cache_equals_the_whole_path(reduced_flow: CausalMaskedDiffWithXvec) -> None:
    dit = reduced_flow.decoder.estimator
    x, mu, cond = _rand(2, 80, 9, seed=1), _rand(2, 80, 9, seed=2), _rand(2, 80, 9, seed=3)
    spks, t = _rand(2, 80, seed=4), torch.tensor([0.3, 0.3])
    whole = dit(x, torch.ones(2, 1, 9), mu, t, spks, cond)
    chunk, cnn, att = dit.forward_chunk(x, mu, t, spks, cond)
    torch.testing.assert_close(chunk, whole, atol=1e-5, rtol=0)
    assert cnn.shape == (2, 2, 128, 2) and att.shape == (2, 2, 2, 9, 64)


# ---------------------------------------------------------------- encoder pieces


def test_pre_lookahead_layer_in_chunks_equals_the_whole_sequence() -> None:
    layer = _randomize(PreLookaheadLayer(6, 3), 11)
    x = _rand(1, 20, 6, seed=12)
    whole = layer(x)
    out, cache = layer.forward_chunk(x[:, 0 : 8 + 3])  # tokens 0..7 + lookahead 8..10
    parts = [out]
    out, cache = layer.forward_chunk(x[:, 8 : 15 + 3], cache)
    parts.append(out)
    out, _ = layer.forward_chunk(F.pad(x[:, 15:], (0, 0, 0, 3)), cache)  # last chunk: zero lookahead
    parts.append(out)
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, atol=ATOL, rtol=0)


def test_upsampler_repeats_frames_and_streams_with_its_cache() -> None:
    up = _randomize(Upsample1D(4, 4, 2), 13)
    x = _rand(1, 4, 9, seed=14)
    whole, lens = up(x, torch.tensor([9]))
    assert whole.shape == (1, 4, 18) and int(lens) == 18
    rep = x.repeat_interleave(2, dim=2)
    torch.testing.assert_close(whole, up.conv(F.pad(rep, (4, 0))), atol=ATOL, rtol=0)
    a, cache = up.forward_chunk(x[..., :4])
    b, _ = up.forward_chunk(x[..., 4:], cache)
    torch.testing.assert_close(torch.cat([a, b], dim=2), whole, atol=ATOL, rtol=0)


def test_encoder_chunk_path_for_a_single_last_chunk_equals_the_whole_path(
    reduced_flow: CausalMaskedDiffWithXvec,
) -> None:
    enc = reduced_flow.encoder
    xs = _rand(1, 13, 64, seed=15)
    whole, mask = enc(xs, torch.tensor([13]))
    chunk, cnn, att = enc.forward_chunk(xs, last_chunk=True)
    torch.testing.assert_close(chunk, whole, atol=1e-5, rtol=0)
    assert bool(mask.all()) and mask.shape == (1, 1, 26)
    assert cnn.shape == (1, 64, 6) and att.shape == (3, 1, 2, 26, 64)


# ---------------------------------------------------------------- CFM sampler


class _LinearField(nn.Module):
    """v(x, t | mu) = -x + t * mu, records the timesteps it was called with."""

    out_channels = 2

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[torch.Tensor] = []

    def forward(self, x, mask, mu, t, spks, cond):  # noqa: ANN001, ANN201 - estimator signature
        self.calls.append(t.clone())
        return -x + t[:, None, None] * mu


@pytest.mark.parametrize("n_timesteps", [10, 5, 1])
def test_cfm_euler_steps_follow_the_cosine_schedule_with_guidance(n_timesteps: int) -> None:
    field = _LinearField()
    cfm = CausalConditionalCFM(field, inference_cfg_rate=0.7, noise_frames=16)  # type: ignore[arg-type]
    mu = _rand(1, 2, 6, seed=16)
    got = cfm(mu, torch.ones(1, 1, 6), torch.zeros(1, 2), torch.zeros(1, 2, 6), n_timesteps=n_timesteps)

    k = np.arange(n_timesteps + 1, dtype=np.float64)
    t_span = 1.0 - np.cos(k / n_timesteps * np.pi / 2)
    np.testing.assert_allclose(cosine_t_span(n_timesteps, torch.device("cpu"), torch.float32), t_span, atol=1e-7)
    x = cfm.rand_noise[:, :, :6].double().numpy()
    m = mu.double().numpy()
    t, dt, seen = t_span[0], t_span[1] - t_span[0], []
    for step in range(1, n_timesteps + 1):
        seen.append(t)
        v_cond, v_uncond = -x + t * m, -x  # the unconditional half sees mu = 0
        x = x + dt * (1.7 * v_cond - 0.7 * v_uncond)
        t = t + dt
        if step < n_timesteps:
            dt = t_span[step + 1] - t
    np.testing.assert_allclose(got.double().numpy(), x, atol=ATOL)
    assert len(field.calls) == n_timesteps
    np.testing.assert_allclose([float(c[0]) for c in field.calls], seen, atol=1e-7)
    assert all(c.shape == (2,) and c[0] == c[1] for c in field.calls)
