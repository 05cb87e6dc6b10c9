# SPDX-License-Identifier: Apache-2.0
"""The stand-in producer's codec sequence, as a pure function (the model and the tests share it).

A request's codes depend only on its prompt: the producer emits `next = offset + f(prev, position)`
with `f(prev, position) = (1103 * prev_code + 17 * position + 12345) mod 6561`, where `prev_code`
is the previous token minus `offset` when it is a codec token, else the token id mod 6561, and
`position` is the previous token's position in the sequence (prompt positions first). So a test
computes what the engine streamed without running the model: `expected_codes(prompt_ids, n)`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

CODEC_SIZE = 6561
_A, _B, _C = 1103, 17, 12345


def forced_next(token_ids: torch.Tensor, positions: torch.Tensor, offset: int) -> torch.Tensor:
    """The token that follows each `(token id, position)` pair (int64, same shape)."""
    ids = token_ids.to(torch.int64)
    prev = torch.where(ids >= offset, ids - offset, ids % CODEC_SIZE) if offset else ids % CODEC_SIZE
    return offset + (prev * _A + positions.to(torch.int64) * _B + _C) % CODEC_SIZE


def expected_codes(prompt_ids: Sequence[int], count: int, offset: int = 0) -> np.ndarray:
    """The first `count` codec ids (without `offset`) the producer emits after `prompt_ids`."""
    if not prompt_ids:
        raise ValueError("the stand-in producer needs a non-empty prompt")
    token, position = int(prompt_ids[-1]), len(prompt_ids) - 1
    codes = np.empty(count, dtype=np.int64)
    for i in range(count):
        nxt = int(forced_next(torch.tensor([token]), torch.tensor([position]), offset)[0])
        codes[i] = nxt - offset
        token, position = nxt, position + 1
    return codes


__all__ = ["CODEC_SIZE", "expected_codes", "forced_next"]
