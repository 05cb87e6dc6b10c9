# SPDX-License-Identifier: Apache-2.0
"""What the manual reference checks share (`vllm_omni_token2wav.tools.cosyvoice_reference`), minus the reference."""

from __future__ import annotations

import pytest
import torch

from vllm_omni_token2wav.tools.cosyvoice_reference import diff_stats, seeded_inputs

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def test_seeded_inputs_are_the_same_every_call_with_two_mel_frames_per_prompt_token() -> None:
    prompt_tokens, prompt_mel, embedding, tokens = seeded_inputs(20, 30)
    assert prompt_tokens.shape == (1, 20) and prompt_mel.shape == (1, 40, 80)
    assert embedding.shape == (1, 192) and tokens.shape == (1, 30)
    assert int(prompt_tokens.min()) >= 0 and int(tokens.max()) < 6561
    again = seeded_inputs(20, 30)
    assert all(torch.equal(a, b) for a, b in zip(again, (prompt_tokens, prompt_mel, embedding, tokens), strict=True))


def test_diff_stats_are_max_abs_relative_l2_and_reference_scale() -> None:
    reference = torch.tensor([3.0, -4.0])
    stats = diff_stats(torch.tensor([3.0, -3.0]), reference)
    assert stats == pytest.approx({"max_abs": 1.0, "rel_l2": 0.2, "max_ref": 4.0})
