# SPDX-License-Identifier: Apache-2.0
"""Torch model of the speech tokenizer v2: 128-bin log-mel (100 Hz) -> 25 Hz codes in [0, 6561).

Upstream ships this network only as `speech_tokenizer_v2_25hz.onnx` and runs it in a CPU
onnxruntime session; the in-tree model takes the same weights (`onnx_loader`) and runs on the
serving device. Module names follow the upstream torch definition, so the state_dict has 102 keys
and 123,714,568 parameters at full size.

Encoder: conv1 (128 -> 1280, k3 s2 p1) + GELU, conv2 (1280 -> 1280, k3 s2 p1) + GELU, the input
masked before each conv; 6 pre-norm blocks of
    x += out(attn(attn_ln(x))) + fsmn(v)        attn_ln eps 1e-6, 20 heads x 64, key without bias,
                                                NeoX rotate-half RoPE (theta 1e4) on q and k, q and k
                                                each scaled by 64^-0.25, pad bias -1e10, fp32 softmax;
                                                fsmn(v) = (dwconv31(v * m) + v * m) * m, before RoPE
    x += mlp(mlp_ln(x))                         mlp_ln eps 1e-5, 1280 -> 5120 exact GELU -> 1280
and no final norm.

FSQ (`FSQCodebook.encode`): h = tanh(project_down(x)) (8 dims, fp32); digit_i = round(0.999 h_i) + 1
in {0, 1, 2}; code = sum_i digit_i 3^i (dim 0 least significant). Rounding variant: torch.round /
ONNX Round, i.e. round half to even, applied to 0.999 h (the 0.999 is the float32 literal
0.9990000128746033). Because |0.999 h| < 1, each digit is -1, 0 or 1 before the +1 and an exact
tie (|0.999 h| == 0.5) maps to digit 1 (round(+-0.5) == 0); a round-half-away-from-zero
implementation would give 0 or 2 there and disagree with the shipped file on such ties.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vllm_omni_token2wav.model_executor.layers.speech_tokenizer.config import (
    FULL_TOKENIZER_CONFIG,
    HEAD_DIM,
    SpeechTokenizerV2Config,
)

FSQ_SCALE = 0.9990000128746033
MASK_BIAS = -1.0e10


def rope_tables(config: SpeechTokenizerV2Config) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [rope_positions, 64] in the rotate-half layout (each half repeated), float32."""
    half = HEAD_DIM // 2
    # Explicit CPU: computed the same way whatever device context the model is built under
    # (under torch.device("meta") a bare arange would be a shapeless placeholder).
    cpu = torch.device("cpu")
    exponents = torch.arange(0, HEAD_DIM, 2, dtype=torch.float32, device=cpu)[:half] / HEAD_DIM
    inv_freq = 1.0 / (config.rope_theta**exponents)
    angles = torch.outer(torch.arange(config.rope_positions, dtype=torch.float32, device=cpu), inv_freq)
    freqs_cis = torch.polar(torch.ones_like(angles), angles)
    cos, sin = freqs_cis.real, freqs_cis.imag
    return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def non_pad_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """[B, max_len] float mask, 1 where position < length."""
    positions = torch.arange(max_len, device=lengths.device)
    return (positions[None, :] < lengths[:, None]).to(torch.float32)


def conv_out_length(lengths: torch.Tensor) -> torch.Tensor:
    return (lengths - 1) // 2 + 1


def code_count(frames: int) -> int:
    """Codes of an unpadded `frames`-frame window: `conv_out_length` twice (the two stride-2 convs), on host ints."""
    for _ in range(2):
        frames = (frames - 1) // 2 + 1
    return frames


class FSMNMultiHeadAttention(nn.Module):
    """Self-attention with a depthwise-conv (FSMN) memory over the values. Keys: query/key/value/out/fsmn_block."""

    def __init__(self, n_state: int, n_head: int, kernel_size: int, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state, dtype=dtype)
        self.key = nn.Linear(n_state, n_state, bias=False, dtype=dtype)
        self.value = nn.Linear(n_state, n_state, dtype=dtype)
        self.out = nn.Linear(n_state, n_state, dtype=dtype)
        self.fsmn_block = nn.Conv1d(n_state, n_state, kernel_size, groups=n_state, bias=False, dtype=dtype)
        self.left_pad = (kernel_size - 1) // 2
        self.right_pad = kernel_size - 1 - self.left_pad

    def _fsmn(self, v: torch.Tensor, mask_pad: torch.Tensor) -> torch.Tensor:
        v = v * mask_pad
        memory = self.fsmn_block(F.pad(v.transpose(1, 2), (self.left_pad, self.right_pad))).transpose(1, 2)
        return (memory + v) * mask_pad

    def forward(
        self, x: torch.Tensor, bias: torch.Tensor, mask_pad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        batch, time, n_state = x.shape
        q = self.query(x).view(batch, time, self.n_head, HEAD_DIM)
        k = self.key(x).view(batch, time, self.n_head, HEAD_DIM)
        v_flat = self.value(x)
        memory = self._fsmn(v_flat, mask_pad)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        scale = HEAD_DIM**-0.25
        q = q.permute(0, 2, 1, 3) * scale
        k = k.permute(0, 2, 3, 1) * scale
        v = v_flat.view(batch, time, self.n_head, HEAD_DIM).permute(0, 2, 1, 3)
        scores = (q @ k + bias).float()
        weights = F.softmax(scores, dim=-1).to(q.dtype)
        attended = (weights @ v).permute(0, 2, 1, 3).reshape(batch, time, n_state)
        return self.out(attended) + memory


class ResidualAttentionBlock(nn.Module):
    def __init__(self, config: SpeechTokenizerV2Config, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.attn = FSMNMultiHeadAttention(config.n_state, config.n_head, config.fsmn_kernel, dtype=dtype)
        self.attn_ln = nn.LayerNorm(config.n_state, eps=1e-6, dtype=dtype)
        self.mlp = nn.Sequential(
            nn.Linear(config.n_state, config.n_mlp, dtype=dtype),
            nn.GELU(),
            nn.Linear(config.n_mlp, config.n_state, dtype=dtype),
        )
        self.mlp_ln = nn.LayerNorm(config.n_state, eps=1e-5, dtype=dtype)

    def forward(
        self, x: torch.Tensor, bias: torch.Tensor, mask_pad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_ln(x), bias, mask_pad, cos, sin)
        return x + self.mlp(self.mlp_ln(x))


class AudioEncoderV2(nn.Module):
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, config: SpeechTokenizerV2Config, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(config.n_mels, config.n_state, 3, stride=2, padding=1, dtype=dtype)
        self.conv2 = nn.Conv1d(config.n_state, config.n_state, 3, stride=2, padding=1, dtype=dtype)
        self.blocks = nn.ModuleList(ResidualAttentionBlock(config, dtype=dtype) for _ in range(config.n_layer))
        cos, sin = rope_tables(config)
        # Non-persistent: derived from the config; the shipped weights carry no tables.
        self.register_buffer("rope_cos", cos.to(dtype), persistent=False)
        self.register_buffer("rope_sin", sin.to(dtype), persistent=False)

    def forward(self, mel: torch.Tensor, mel_len: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """mel [B, n_mels, T], mel_len [B] -> hidden [B, T', n_state], lengths [B]."""
        mask = non_pad_mask(mel_len, mel.shape[-1]).to(mel.dtype)[:, None, :]
        x = F.gelu(self.conv1(mel * mask))
        lengths = conv_out_length(mel_len)
        mask = non_pad_mask(lengths, x.shape[-1]).to(x.dtype)[:, None, :]
        x = F.gelu(self.conv2(x * mask))
        lengths = conv_out_length(lengths)
        time = x.shape[-1]
        if time > self.rope_cos.shape[0]:
            raise ValueError(
                f"speech tokenizer window has {time} token positions but RoPE covers {self.rope_cos.shape[0]}; "
                "audio must be split into <= 30 s windows first (SpeechTokenizer.tokenize does this)"
            )
        mask = non_pad_mask(lengths, time).to(x.dtype)
        x = x.transpose(1, 2)
        mask_pad = mask[:, :, None]
        bias = ((1.0 - mask) * MASK_BIAS)[:, None, None, :]
        cos = self.rope_cos[:time][None, :, None, :]
        sin = self.rope_sin[:time][None, :, None, :]
        for block in self.blocks:
            x = block(x, bias, mask_pad, cos, sin)
        return x, lengths


def fsq_digits(h: torch.Tensor) -> torch.Tensor:
    """tanh outputs in (-1, 1) -> FSQ digits in {0, 1, 2}: round-half-to-even(0.999 h) + 1."""
    return torch.round(h * FSQ_SCALE) + 1.0


class FSQCodebook(nn.Module):
    def __init__(self, n_state: int, dims: int, levels: int, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.levels = levels
        self.project_down = nn.Linear(n_state, dims, dtype=dtype)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """hidden [B, T, n_state] -> codes [B, T] int64 (see the module docstring for the rounding)."""
        digits = fsq_digits(torch.tanh(self.project_down(x).float()))
        powers = torch.pow(
            torch.full((), float(self.levels), device=x.device),  # a fill, not a blocking host copy
            torch.arange(digits.shape[-1], device=x.device, dtype=torch.float32),
        )
        return torch.sum(digits * powers, dim=-1).to(torch.int64)


class FSQVectorQuantization(nn.Module):
    def __init__(self, config: SpeechTokenizerV2Config, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self._codebook = FSQCodebook(config.n_state, config.fsq_dims, config.fsq_levels, dtype=dtype)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self._codebook.encode(x)


class SpeechTokenizerV2(nn.Module):
    """`forward(mel [B, 128, T], mel_len [B]) -> (codes [B, T'] int64, code_len [B])` for one <= 30 s window."""

    def __init__(self, config: SpeechTokenizerV2Config = FULL_TOKENIZER_CONFIG, *, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.config = config
        self.encoder = AudioEncoderV2(config, dtype=dtype)
        self.quantizer = FSQVectorQuantization(config, dtype=dtype)

    def forward(self, mel: torch.Tensor, mel_len: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, lengths = self.encoder(mel, mel_len)
        return self.quantizer.encode(hidden), lengths
