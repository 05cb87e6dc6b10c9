# SPDX-License-Identifier: Apache-2.0
"""A segment's error message as the tensor vLLM-Omni's runner can carry: `token2wav_error`.

vLLM-Omni 0.30's generation runner turns a dict-valued `multimodal_outputs` into per-request payloads
by calling `out[i].detach()` on every entry of every list. A `None` or a `str` there raises
AttributeError inside the engine core process, which kills the engine and loses every in-flight
request. So a segment's error travels as a tensor: key `ERROR_KEY`, one 1-D uint8 tensor per segment
holding the UTF-8 message, empty (numel 0) when the segment has no error.

Both sides use this module: the stage's `contract.build_output` encodes, and the engine-side patch
(a scheduler wrapper in the engine core process that finishes the request with `FinishReason.ERROR`
and the message as its stop reason) and tests decode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

#: The `multimodal_outputs` key of the per-segment error messages.
ERROR_KEY = "token2wav_error"


def encode_error(message: str | None) -> torch.Tensor:
    """`message` as a 1-D uint8 CPU tensor of its UTF-8 bytes; an empty tensor for None (no error)."""
    if message is None:
        return torch.empty(0, dtype=torch.uint8)
    return torch.tensor(list(message.encode("utf-8")), dtype=torch.uint8)


def decode_error(t: torch.Tensor | None) -> str | None:
    """The message `encode_error` encoded: None for None or an empty tensor.

    Raises ValueError for a tensor that is not uint8 (not an encoded message).
    """
    if t is None or t.numel() == 0:
        return None
    if t.dtype != torch.uint8:
        raise ValueError(f"{ERROR_KEY}: expected a 1-D uint8 tensor of UTF-8 bytes, got dtype {t.dtype}")
    return bytes(t.detach().cpu().reshape(-1).tolist()).decode("utf-8", errors="replace")


def segment_errors(multimodal_outputs: Mapping[str, Any]) -> list[str | None]:
    """Every segment's message (None where it has none) from a stage output's `multimodal_outputs`."""
    return [decode_error(t) for t in multimodal_outputs[ERROR_KEY]]


__all__ = ["ERROR_KEY", "decode_error", "encode_error", "segment_errors"]
