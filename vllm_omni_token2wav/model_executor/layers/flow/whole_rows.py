# SPDX-License-Identifier: Apache-2.0
"""Several whole utterances of the CosyVoice2-style flow (Step-Audio2) in one launch, each row equal to its run alone.

The whole-utterance call (`CausalMaskedDiffWithXvec.inference`, what Step-Audio2's sync path serves) is the
bidirectional conformer over [prompt | generated], then the CFM over the DiT with full attention (an all-ones
padding mask). `inference_rows` runs the rows of a step through the CFM's Euler solve together: rows are laid
end to end on one time axis (`(2 CFG, sum F_i, C)`, the layout the stream kernels use), not padded, so that
every row's mel is what `inference` gives it alone (float32, bit-identical on the reduced stand-in:
`tests/model_executor/layers/flow/test_whole_rows.py`).

| part                            | across rows                                                            |
|---------------------------------|------------------------------------------------------------------------|
| conformer encoder, encoder_proj | per row (`whole_inputs`): relative-position attention and its batch-1   |
|                                 | convolutions round with the row's own length (~3 % of the flow's work)  |
| starting noise                  | the flow's fixed noise buffer, columns 0..F_i-1 of each row, as alone   |
| time embedding, modulations     | once per Euler step, batch 2 as alone (every row is at the same t)     |
| projections, LayerNorms, MLP    | once over all frames (a GEMM's rows are independent)                    |
| causal conv branch              | per row over its own frames (zeros before its first frame, as alone)    |
| attention                       | per row, full attention over its own frames with the all-ones mask the |
|                                 | row alone passes (the same SDPA call)                                   |

The DiT has no positional encoding, so nothing else depends on where a row sits on the axis. The vocoder
(HiFT, its NSF noise drawn from the request's generator) runs per row afterwards
(`token2wav_core/synthesis.synthesize_utterances`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from vllm_omni_token2wav.model_executor.layers.flow.euler import cfg_pair, euler_cfg

if TYPE_CHECKING:
    from vllm_omni_token2wav.model_executor.layers.flow.flow import CausalMaskedDiffWithXvec


@dataclass(frozen=True)
class WholeRow:
    """One whole utterance: generated ids `(1, T)`, prompt ids `(1, P)`, prompt mel `(1, up P, 80)` and the
    CAM++ embedding `(1, 192)` of its voice."""

    tokens: torch.Tensor
    prompt_tokens: torch.Tensor
    prompt_mel: torch.Tensor
    embedding: torch.Tensor


@torch.inference_mode()
def inference_rows(flow: CausalMaskedDiffWithXvec, rows: Sequence[WholeRow], *, n_timesteps: int) -> list[torch.Tensor]:
    """Mel `(1, 80, up T_i)` of each row's generated tokens, the CFM of all rows in one launch (module docstring).

    Raises ValueError naming the row (`inference_rows[i]`) for a bad input, before anything is launched.
    """
    if not rows:
        return []
    if n_timesteps < 1:
        raise ValueError(f"flow.inference_rows: n_timesteps must be >= 1, got {n_timesteps}")
    inputs = []
    for i, row in enumerate(rows):
        where = f"inference_rows[{i}]"
        tokens, prompt_tokens, prompt_mel = row.tokens, row.prompt_tokens, row.prompt_mel
        args = (tokens, tokens.size(-1), prompt_tokens, prompt_tokens.size(-1), prompt_mel, prompt_mel.size(-2))
        inputs.append(flow.whole_inputs(*args, row.embedding, where))
    cfm = flow.decoder
    spans: list[tuple[int, int]] = []
    start = 0
    for mu, _, _, _ in inputs:
        spans.append((start, start + mu.size(2)))
        start += mu.size(2)
    dtype = inputs[0][0].dtype
    x = torch.cat([cfm.noise(0, mu.size(2)).to(dtype) for mu, _, _, _ in inputs], dim=2) * 1.0  # temperature 1
    mu_in = cfg_pair(torch.cat([mu for mu, _, _, _ in inputs], dim=2))
    cond_in = cfg_pair(torch.cat([cond for _, cond, _, _ in inputs], dim=2))
    spk_in = cfg_pair(torch.cat([spk[:, :, None].expand(-1, -1, mu.size(2)) for mu, _, spk, _ in inputs], dim=2))
    estimator = cfm.estimator

    def velocity(step: int, x_in: torch.Tensor, t_in: torch.Tensor) -> torch.Tensor:
        return estimator.forward_rows(x_in, mu_in, t_in, spk_in, cond_in, spans)

    mel = euler_cfg(x, n_timesteps, cfm.inference_cfg_rate, velocity)
    return [mel[:, :, s + p : e] for (s, e), (_, _, _, p) in zip(spans, inputs, strict=True)]


__all__ = ["WholeRow", "inference_rows"]
