# SPDX-License-Identifier: Apache-2.0
"""Several CosyVoice3 whole utterances in one flow launch, each row equal to the same utterance run alone.

Upstream's non-streaming call (`flow.inference(streaming=False, finalize=True)`) is full attention over
[prompt | generated] with a padding mask only; vLLM-Omni's opt-in `COSYVOICE3_BATCH_FLOW` pads the rows
of a step to one length. `inference_rows` runs the rows of a step in one Euler solve so that every
row's mel is bit-for-bit what `CausalMaskedDiffWithDiT.inference` gives for it alone (float32, measured
on the reduced stand-in: `tests/model_executor/layers/flow_cosyvoice3/test_whole_rows.py`).

Rows are laid end to end on one time axis (`(2 CFG, sum F_i, dim)`, the layout `batched.py` uses for
stream chunks), not padded to a common length, because two things round with the shape they see:

| part                          | across rows                                                           |
|-------------------------------|-----------------------------------------------------------------------|
| time embedding, modulations   | once per Euler step, batch 2 as alone (every row is at the same t; a  |
|                               | `(2B, dim)` GEMM rounds differently from `(2, dim)`: 4.8e-7 measured)  |
| pre-lookahead layer (mu)      | per row, at its own length (zeros after its last token, as alone)     |
| starting noise                | each row's own table (`noise_seed`), columns 0..F_i-1                 |
| projections, per-frame ops    | once over all frames (a GEMM's rows are independent)                  |
| RoPE                          | each row's frames at positions 0..F_i-1                               |
| conv position embedding       | per row over its own frames: the call it makes alone (oneDNN's grouped |
|                               | Conv1d rounds with the input length)                                  |
| attention                     | per row, full attention over its own frames: the SDPA call it makes   |
|                               | alone (a key-padding mask over a longer axis changes the CPU flash    |
|                               | kernel's blocking: 1.8e-7 per call measured)                          |

`frames` pads the axis (graph buckets) with a zero pseudo-row that no real frame reads. A launch reads
no tensor value on the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from vllm_omni_token2wav.model_executor.layers.flow.euler import cfg_pair, euler_cfg

if TYPE_CHECKING:
    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.flow import CausalMaskedDiffWithDiT


@dataclass(frozen=True)
class WholeRow:
    """One whole utterance: generated ids `(1, T)`, its prompt (ids `(1, P)`, aligned mel `(1, 2P, 80)`,
    CAM++ embedding `(1, 192)`) and the seed of its noise table (0: upstream's)."""

    tokens: torch.Tensor
    prompt_tokens: torch.Tensor
    prompt_mel: torch.Tensor
    embedding: torch.Tensor
    noise_seed: int


@dataclass(frozen=True)
class _Prepared:
    mu: torch.Tensor  # (1, 80, F)
    cond: torch.Tensor  # (1, 80, F)
    noise: torch.Tensor  # (1, 80, F)
    spk: torch.Tensor  # (1, 80)
    prompt_frames: int

    @property
    def frames(self) -> int:
        return int(self.mu.size(2))


def _prepare(flow: CausalMaskedDiffWithDiT, row: WholeRow, index: int) -> _Prepared:
    """The row's checked inputs, computed as `flow.inference` computes them for one utterance."""
    where = f"inference_rows[{index}]"
    tokens = flow.tokens(row.tokens, "tokens", where, clamp_negative=True)
    prompt_tokens = flow.tokens(row.prompt_tokens, "prompt_tokens", where, clamp_negative=True)
    prompt_mel = flow.prompt_mel(row.prompt_mel, prompt_tokens.size(1), where)
    if tokens.size(1) == 0:
        raise ValueError(f"flow.{where}: no generated tokens; a whole utterance needs at least 1")
    ids = torch.cat([prompt_tokens, tokens], dim=1)
    frames = flow.config.token_mel_ratio * ids.size(1)
    noise = flow.noise(row.noise_seed, None, frames, where)[:, :, :frames]
    mu = flow.mu(ids, history=0, lookahead_pad=flow.config.pre_lookahead_len)
    cond = torch.zeros_like(mu)
    cond[:, :, : prompt_mel.size(1)] = prompt_mel.transpose(1, 2)
    return _Prepared(mu, cond, noise, flow.speaker(row.embedding, where), int(prompt_mel.size(1)))


@torch.inference_mode()
def inference_rows(
    flow: CausalMaskedDiffWithDiT,
    rows: Sequence[WholeRow],
    *,
    n_timesteps: int,
    frames: int | None = None,
) -> list[torch.Tensor]:
    """Mel `(1, 80, 2 T_i)` float32 of each row's generated tokens, all rows in one launch (module docstring).

    `frames`: the launch's total frames on the time axis (graph buckets); the frames beyond the rows' form a zero
    pseudo-row nothing reads. None or less than the rows' total: no padding. Raises ValueError naming the row
    for a bad input.
    """
    if not rows:
        return []
    if n_timesteps < 1:
        raise ValueError(f"flow.inference_rows: n_timesteps must be >= 1, got {n_timesteps}")
    prepared = [_prepare(flow, row, i) for i, row in enumerate(rows)]
    spans: list[tuple[int, int]] = []
    start = 0
    for p in prepared:
        spans.append((start, start + p.frames))
        start += p.frames
    total = max(start, frames or 0)
    pad = total - start

    def laid(parts: list[torch.Tensor]) -> torch.Tensor:
        """`(1, C, F_i)` per row -> `(1, C, total)`: rows end to end, then zeros."""
        return F.pad(torch.cat(parts, dim=2), (0, pad))

    noise = laid([p.noise for p in prepared])
    mu_in = cfg_pair(laid([p.mu for p in prepared]))
    cond_in = cfg_pair(laid([p.cond for p in prepared]))
    spk_in = cfg_pair(laid([p.spk[:, :, None].expand(-1, -1, p.frames) for p in prepared]))
    device = noise.device
    positions = torch.cat(
        [torch.arange(p.frames, device=device) for p in prepared] + [torch.zeros(pad, dtype=torch.long, device=device)]
    )
    conv_pos = flow.estimator.input_embed.conv_pos_embed
    estimator = flow.estimator

    def pos_embed(h: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(h)
        for s, e in spans:  # per row: the call a row makes alone ((2, F_i, dim), zeros before its first frame)
            out[:, s:e] = conv_pos(h[:, s:e])[0]
        return out

    def attend(block: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(q)
        for s, e in spans:  # per row, full attention over its own frames
            out[:, :, s:e] = F.scaled_dot_product_attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e])
        return out

    def velocity(step: int, x_in: torch.Tensor, t_in: torch.Tensor) -> torch.Tensor:
        return estimator.forward_frames(
            x_in, mu_in, t_in, spk_in, cond_in, positions=positions, pos_embed=pos_embed, attend=attend
        )

    mel = euler_cfg(noise, n_timesteps, flow.decoder.inference_cfg_rate, velocity)
    return [mel[:, :, s + p.prompt_frames : e].float() for (s, e), p in zip(spans, prepared, strict=True)]


__all__ = ["WholeRow", "inference_rows"]
