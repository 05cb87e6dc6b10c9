# SPDX-License-Identifier: Apache-2.0
"""Upstream's chunk schedule for CosyVoice3 streaming: how many tokens each flow call covers.

`CosyVoice3Model.tts(stream=True)` (CosyVoice2Model's loop, `token_hop_len` 25, max 4 x 25, scale 2):
- the first call covers `25 + pad` tokens, pad = ceil(P / 25) * 25 - P for a prompt of P tokens, so
  prompt + first hop ends on a 25-token (50-frame) boundary of the block-causal mask;
- then 50, then 100 tokens per call (x2 each time, capped at 100);
- a call happens once `hop + 3` tokens past the offset are available (3 = lookahead), with the prefix
  up to `offset + hop + 3`; when the LLM has finished and fewer remain, one last call takes all tokens
  with `finalize=True`.
Upstream keeps the growing hop on the model object and never resets it, so a second request starts at
100 + pad; `upstream_hops` gives the per-request schedule (what a first request sees) and documents the
difference rather than reproducing process-global state.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

CHUNK_TOKENS = 25
MAX_HOP_TOKENS = 4 * CHUNK_TOKENS
HOP_SCALE = 2


def upstream_hops(
    prompt_tokens: int, *, chunk_tokens: int = CHUNK_TOKENS, max_hop: int = MAX_HOP_TOKENS, scale: int = HOP_SCALE
) -> Iterator[int]:
    """Tokens emitted by each non-final call: 25 + pad, 50, 100, 100, ..."""
    if prompt_tokens < 0 or chunk_tokens < 1 or max_hop < chunk_tokens or scale < 1:
        raise ValueError(
            f"upstream_hops: prompt_tokens={prompt_tokens}, chunk_tokens={chunk_tokens}, max_hop={max_hop}, "
            f"scale={scale} out of range"
        )
    hop = chunk_tokens
    yield hop + (-prompt_tokens) % chunk_tokens
    while True:
        hop = min(max_hop, hop * scale)
        yield hop


@dataclass(frozen=True)
class ScheduledCall:
    """One flow call of a stream over a known token sequence: feed `tokens[start:end]`."""

    start: int
    end: int
    final: bool
    #: generated tokens before the first token this call emits (upstream's `token_offset`)
    offset: int


def stream_calls(num_tokens: int, prompt_tokens: int, *, lookahead: int = 3, **hop_options: int) -> list[ScheduledCall]:
    """The calls upstream makes for `num_tokens` generated tokens that are all available.

    Each call's `[start, end)` is what the incremental `stream_chunk` API is fed; `end` is the prefix
    length upstream passes (`offset + hop + lookahead`, or all tokens for the final call).
    """
    if num_tokens < 1:
        raise ValueError(f"stream_calls: need at least one generated token, got {num_tokens}")
    calls: list[ScheduledCall] = []
    offset = fed = 0
    for hop in upstream_hops(prompt_tokens, **hop_options):
        if num_tokens - offset < hop + lookahead:
            break
        calls.append(ScheduledCall(fed, offset + hop + lookahead, False, offset))
        fed = offset + hop + lookahead
        offset += hop
    calls.append(ScheduledCall(fed, num_tokens, True, offset))
    return calls
