# SPDX-License-Identifier: Apache-2.0
"""Step-Audio2's flow, several whole utterances in one launch (`whole_rows.inference_rows`): each row's mel equals
`CausalMaskedDiffWithXvec.inference` of that utterance alone (bit-identical measured; asserted to a few ulps)."""

from __future__ import annotations

import pytest
import torch

from tests.model_executor.layers.flow.inputs import make_prompt, make_tokens
from vllm_omni_token2wav.model_executor.layers.flow.flow import CausalMaskedDiffWithXvec
from vllm_omni_token2wav.model_executor.layers.flow.whole_rows import WholeRow, inference_rows

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

N_STEPS = 3
#: launch vs alone, in float32 eps of the row's largest |mel|: 0 measured here; a few ulps leave room for CPUs
#: whose GEMM kernels round a row with the matrix height, and fail a row that reads another row's frames
ULPS = 8


def _alone(flow: CausalMaskedDiffWithXvec, row: WholeRow) -> torch.Tensor:
    return flow.inference(
        row.tokens,
        row.tokens.size(1),
        row.prompt_tokens,
        row.prompt_tokens.size(1),
        row.prompt_mel,
        row.prompt_mel.size(1),
        row.embedding,
        n_timesteps=N_STEPS,
    )


def _rows() -> list[WholeRow]:
    shapes = ((12, 40), (4, 9), (20, 57), (8, 23))  # (prompt tokens, generated tokens): all different
    return [WholeRow(make_tokens(n, seed=60 + i), *make_prompt(p, seed=70 + i)) for i, (p, n) in enumerate(shapes)]


def test_each_row_of_one_launch_equals_its_run_alone(reduced_flow: CausalMaskedDiffWithXvec) -> None:
    rows = _rows()
    mels = inference_rows(reduced_flow, rows, n_timesteps=N_STEPS)
    for i, (row, mel) in enumerate(zip(rows, mels, strict=True)):
        alone = _alone(reduced_flow, row)
        assert mel.shape == alone.shape == (1, 80, reduced_flow.up_rate * row.tokens.size(1)), i
        bound = ULPS * torch.finfo(torch.float32).eps * float(alone.abs().max())
        assert float((mel - alone).abs().max()) <= bound, f"row {i}: {(mel - alone).abs().max():.3g} > {bound:.3g}"


def test_rows_do_not_leak_into_each_other(reduced_flow: CausalMaskedDiffWithXvec) -> None:
    rows = _rows()
    before = inference_rows(reduced_flow, rows, n_timesteps=N_STEPS)
    changed = list(rows)
    changed[2] = WholeRow(make_tokens(57, seed=99), rows[2].prompt_tokens, rows[2].prompt_mel, rows[2].embedding)
    after = inference_rows(reduced_flow, changed, n_timesteps=N_STEPS)
    for i in (0, 1, 3):
        assert torch.equal(before[i], after[i]), i
    assert not torch.equal(before[2], after[2])


def test_a_bad_row_is_named(reduced_flow: CausalMaskedDiffWithXvec) -> None:
    rows = _rows()
    rows[1] = WholeRow(torch.tensor([[1, 10**6]]), rows[1].prompt_tokens, rows[1].prompt_mel, rows[1].embedding)
    with pytest.raises(ValueError, match=r"inference_rows\[1\]"):
        inference_rows(reduced_flow, rows, n_timesteps=N_STEPS)
    assert inference_rows(reduced_flow, [], n_timesteps=N_STEPS) == []
