# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3 flow, several whole utterances in one launch (`whole_rows.inference_rows`): each row's mel is
bit-identical to `CausalMaskedDiffWithDiT.inference` of that utterance alone (full attention, finalize)."""

from __future__ import annotations

import pytest
import torch

from tests.model_executor.layers.flow.inputs import make_prompt, make_tokens
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import CausalMaskedDiffWithDiT
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.whole_rows import WholeRow, inference_rows

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

N_STEPS = 2


def _alone(flow: CausalMaskedDiffWithDiT, row: WholeRow) -> torch.Tensor:
    return flow.inference(
        row.tokens,
        row.tokens.size(1),
        row.prompt_tokens,
        row.prompt_tokens.size(1),
        row.prompt_mel,
        row.prompt_mel.size(1),
        row.embedding,
        streaming=False,
        finalize=True,
        n_timesteps=N_STEPS,
        noise_seed=row.noise_seed,
    )


def _rows() -> list[WholeRow]:
    # different prompt lengths (0 included), utterance lengths, voices and noise seeds
    shapes = ((7, 40, 3), (33, 11, 0), (0, 57, 9), (25, 1, 4))
    return [
        WholeRow(make_tokens(n, seed=40 + i), *make_prompt(p, seed=50 + i), seed)
        for i, (p, n, seed) in enumerate(shapes)
    ]


@pytest.mark.parametrize("frames", [None, 500])
def test_each_row_of_one_launch_is_bit_identical_to_its_run_alone(
    cv3_flow: CausalMaskedDiffWithDiT, frames: int | None
) -> None:
    rows = _rows()
    mels = inference_rows(cv3_flow, rows, n_timesteps=N_STEPS, frames=frames)
    assert len(mels) == len(rows)
    for i, (row, mel) in enumerate(zip(rows, mels, strict=True)):
        alone = _alone(cv3_flow, row)
        assert mel.shape == alone.shape == (1, 80, 2 * row.tokens.size(1)), i
        assert torch.equal(mel, alone), f"row {i}: max |launch - alone| = {(mel - alone).abs().max():.3g}"


def test_rows_do_not_leak_into_each_other(cv3_flow: CausalMaskedDiffWithDiT) -> None:
    """Changing one row's tokens leaves every other row's mel unchanged (and changes its own)."""
    rows = _rows()
    before = inference_rows(cv3_flow, rows, n_timesteps=N_STEPS)
    changed = list(rows)
    changed[1] = WholeRow(make_tokens(11, seed=99), rows[1].prompt_tokens, rows[1].prompt_mel, rows[1].embedding, 0)
    after = inference_rows(cv3_flow, changed, n_timesteps=N_STEPS)
    for i in (0, 2, 3):
        assert torch.equal(before[i], after[i]), i
    assert not torch.equal(before[1], after[1])


def test_a_bad_row_is_named(cv3_flow: CausalMaskedDiffWithDiT) -> None:
    rows = _rows()
    rows[2] = WholeRow(torch.tensor([[1, 6561]]), rows[2].prompt_tokens, rows[2].prompt_mel, rows[2].embedding, 0)
    with pytest.raises(ValueError, match=r"inference_rows\[2\]"):
        inference_rows(cv3_flow, rows, n_timesteps=N_STEPS)
    empty = WholeRow(torch.zeros(1, 0, dtype=torch.long), *make_prompt(3, seed=1), 0)
    with pytest.raises(ValueError, match="no generated tokens"):
        inference_rows(cv3_flow, [empty], n_timesteps=N_STEPS)
    assert inference_rows(cv3_flow, [], n_timesteps=N_STEPS) == []
