# SPDX-License-Identifier: Apache-2.0
"""An independent, plain re-implementation of CosyVoice3's flow for the tests (not the code under test).

Written from the reference semantics with different building blocks than `vllm_omni_token2wav`: functional ops
on the raw state_dict, explicit softmax attention with an additive mask, RoPE as complex rotation,
convolutions with explicit padding. One function runs a whole sequence; called on a prefix with
`streaming=True, finalize=False` it IS upstream's per-chunk prefix re-run, the behaviour the cached
streaming path must reproduce.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import CosyVoice3FlowConfig

Weights = dict[str, torch.Tensor]


def _linear(w: Weights, name: str, x: torch.Tensor) -> torch.Tensor:
    return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]


def _layer_norm(x: torch.Tensor) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-6)


def _mish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.tanh(F.softplus(x))


def _token_features(w: Weights, c: CosyVoice3FlowConfig, ids: torch.Tensor, finalize: bool) -> torch.Tensor:
    """mu `(1, 80, 2 T')`: embedding -> pre-lookahead (right context = the ids' own tail or zeros) -> x2."""
    emb = w["input_embedding.weight"][ids.clamp(min=0)]  # (1, T, 80)
    x = emb.transpose(1, 2)
    if finalize:
        x = torch.cat([x, torch.zeros(1, x.size(1), c.pre_lookahead_len)], dim=2)
    y = F.leaky_relu(F.conv1d(x, w["pre_lookahead_layer.conv1.weight"], w["pre_lookahead_layer.conv1.bias"]), 0.01)
    y = torch.cat([torch.zeros(1, y.size(1), 2), y], dim=2)
    y = F.conv1d(y, w["pre_lookahead_layer.conv2.weight"], w["pre_lookahead_layer.conv2.bias"])
    h = y + emb[:, : y.size(2)].transpose(1, 2)
    return h.repeat_interleave(c.token_mel_ratio, dim=2)


def _rope(x: torch.Tensor, positions: torch.Tensor, rot: int) -> torch.Tensor:
    """Rotate channel pairs (2i, 2i+1) of the first `rot` channels by position * 1e4^(-2i/rot)."""
    inv = torch.pow(torch.tensor(10000.0), -torch.arange(0, rot, 2, dtype=torch.float32) / rot)
    angle = positions.float()[:, None] * inv[None, :]
    head = torch.view_as_complex(x[..., :rot].reshape(*x.shape[:-1], rot // 2, 2).contiguous())
    head = torch.view_as_real(head * torch.polar(torch.ones_like(angle), angle)).flatten(-2)
    return torch.cat([head, x[..., rot:]], dim=-1)


def _estimator(
    w: Weights,
    c: CosyVoice3FlowConfig,
    x: torch.Tensor,
    mu: torch.Tensor,
    t: torch.Tensor,
    spk: torch.Tensor,
    cond: torch.Tensor,
    allowed: torch.Tensor,
) -> torch.Tensor:
    p = "decoder.estimator."
    frames = x.size(2)
    half = 128
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / (half - 1))
    arg = (1000.0 * t)[:, None] * freqs[None]
    temb = torch.cat([torch.sin(arg), torch.cos(arg)], dim=1)
    temb = _linear(w, p + "time_embed.time_mlp.2", F.silu(_linear(w, p + "time_embed.time_mlp.0", temb)))
    inp = torch.cat([x, cond, mu, spk[:, :, None].expand(-1, -1, frames)], dim=1).transpose(1, 2)
    h = _linear(w, p + "input_embed.proj", inp)
    pos = h.transpose(1, 2)
    for conv in ("conv1", "conv2"):
        weight, bias = (
            w[f"{p}input_embed.conv_pos_embed.{conv}.0.weight"],
            w[f"{p}input_embed.conv_pos_embed.{conv}.0.bias"],
        )
        pos = _mish(F.conv1d(F.pad(pos, (weight.size(2) - 1, 0)), weight, bias, groups=16))
    h = h + pos.transpose(1, 2)
    positions = torch.arange(frames)
    bias = torch.zeros(frames, frames).masked_fill(~allowed, float("-inf"))
    for i in range(c.depth):
        b = f"{p}transformer_blocks.{i}."
        mods = _linear(w, b + "attn_norm.linear", F.silu(temb)).chunk(6, dim=1)
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = (m[:, None, :] for m in mods)
        n = _layer_norm(h) * (1 + scale_a) + shift_a
        q = _rope(_linear(w, b + "attn.to_q", n), positions, c.dim_head)
        k = _rope(_linear(w, b + "attn.to_k", n), positions, c.dim_head)
        v = _linear(w, b + "attn.to_v", n)
        q, k, v = (z.reshape(z.size(0), frames, c.heads, c.dim_head).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(c.dim_head) + bias, dim=-1) @ v
        att = _linear(w, b + "attn.to_out.0", att.transpose(1, 2).reshape(h.size(0), frames, -1))
        h = h + gate_a * att
        n = _layer_norm(h) * (1 + scale_f) + shift_f
        ff = _linear(w, b + "ff.ff.2", F.gelu(_linear(w, b + "ff.ff.0.0", n), approximate="tanh"))
        h = h + gate_f * ff
    scale, shift = _linear(w, p + "norm_out.linear", F.silu(temb)).chunk(2, dim=1)
    h = _layer_norm(h) * (1 + scale[:, None]) + shift[:, None]
    return _linear(w, p + "proj_out", h).transpose(1, 2)


def reference_mel(
    w: Weights,
    c: CosyVoice3FlowConfig,
    *,
    prompt_ids: torch.Tensor,
    prompt_mel: torch.Tensor,
    embedding: torch.Tensor,
    ids: torch.Tensor,
    noise: torch.Tensor,
    n_timesteps: int,
    streaming: bool,
    finalize: bool,
) -> torch.Tensor:
    """Mel after the prompt, `(1, 80, frames)`, of [prompt | ids] in one run (upstream `flow.inference`)."""
    mu = _token_features(w, c, torch.cat([prompt_ids, ids], dim=1), finalize)
    frames = mu.size(2)
    spk = _linear(w, "spk_embed_affine_layer", embedding / embedding.norm(dim=1, keepdim=True).clamp(min=1e-12))
    cond = torch.zeros_like(mu)
    cond[:, :, : prompt_mel.size(1)] = prompt_mel.transpose(1, 2)
    pos = torch.arange(frames)
    chunk = c.static_chunk_size
    allowed = (
        pos[None, :] < (pos // chunk + 1)[:, None] * chunk
        if streaming
        else torch.ones(frames, frames, dtype=torch.bool)
    )
    x = noise[:, :, :frames].clone()
    t_span = 1 - torch.cos(torch.linspace(0, 1, n_timesteps + 1) * 0.5 * math.pi)
    t = t_span[0]
    dt = t_span[1] - t_span[0]
    zeros = torch.zeros_like
    for step in range(1, n_timesteps + 1):
        v = _estimator(
            w,
            c,
            torch.cat([x, x]),
            torch.cat([mu, zeros(mu)]),
            torch.stack([t, t]),
            torch.cat([spk, zeros(spk)]),
            torch.cat([cond, zeros(cond)]),
            allowed,
        )
        r = c.inference_cfg_rate
        x = x + dt * ((1 + r) * v[:1] - r * v[1:])
        t = t + dt
        if step < n_timesteps:
            dt = t_span[step + 1] - t
    return x[:, :, prompt_mel.size(1) :]
