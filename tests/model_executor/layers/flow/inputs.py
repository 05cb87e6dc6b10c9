# SPDX-License-Identifier: Apache-2.0
"""Seeded inputs (prompt tokens, prompt mel, speaker embedding, tokens) for the flow tests."""

from __future__ import annotations

import torch


def make_prompt(n_prompt_tokens: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prompt tokens (1, Tp), prompt mel (1, 2 Tp, 80), speaker embedding (1, 192)), seeded."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 6561, (1, n_prompt_tokens), generator=g)
    mel = torch.randn(1, 2 * n_prompt_tokens, 80, generator=g) * 0.5 - 4.0
    spk = torch.randn(1, 192, generator=g)
    return tokens, mel, spk


def make_tokens(n: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 6561, (1, n), generator=g)
