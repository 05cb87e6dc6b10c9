# SPDX-License-Identifier: Apache-2.0
"""Streaming state of the flow model: the cache dataclass, its trimming rule and the lookahead variants.

A stream is set up once per prompt (`CausalMaskedDiffWithXvec.setup_cache`) and then fed chunks of
25 tokens + 3 lookahead tokens (`inference_chunk`). The state between chunks is four tensors whose
layouts are the reference's (see `encoder.py`, `dit.py`, `cfm.py`):

| field                 | shape                                        | grows by          |
|-----------------------|----------------------------------------------|-------------------|
| `conformer_cnn_cache` | `(1, C, 6)`                                  | fixed             |
| `conformer_att_cache` | `(L_enc, 1, H, 2t, 2 d_k)` (token layers x2) | 2 x chunk tokens  |
| `estimator_cnn_cache` | `(n, depth, 2, 2 hidden, 2)`                 | fixed             |
| `estimator_att_cache` | `(n, depth, 2, H, t, 2 head_dim)`            | 2 x chunk tokens  |

Trimming (applied by `inference_chunk` after each chunk, as the reference facades do after each call):
- estimator (always, Step-Audio2 and MiniCPM-o): when its time dim exceeds `P + 100`
  (P = prompt mel frames) keep `[:P]` and `[-100:]`. The estimator cache is newest-first, so this keeps
  the newest P frames and the oldest 100 (the reference's rule, kept as is).
- conformer (`trim_conformer_cache`), when its (tiled) time dim exceeds `P + 100`:

  | `ConformerTrim`    | rule                                                          | used by            |
  |--------------------|---------------------------------------------------------------|--------------------|
  | `NONE`             | never trimmed: the cache grows until the 5000-position table  | Step-Audio2        |
  |                    | runs out (about 100 s of audio), then a clear error           |                    |
  | `PROMPT_PLUS_TAIL` | the estimator's rule on the whole tensor: `[:P]` + `[-100:]`  | vLLM-Omni 0.30's   |
  |                    | of every layer, the tiled token-rate layers included          | MiniCPM-o          |
  | `PER_RATE`         | token-rate layers: their first half (one copy of the tiled    | minicpmo-utils     |
  |                    | cache) keeps `[:P // 2]` + `[-50:]` and is re-tiled x2;       | 1.0.7 `Token2wav`  |
  |                    | mel-rate layers keep `[:P]` + `[-100:]`; stacked again        |                    |

  `PROMPT_PLUS_TAIL` applied to a token-rate layer stored as `[c, c]` keeps `c[:P]` (more than the
  prompt's P / 2 tokens) and the end of the second copy, which the encoder then reads back as the
  first half: the two MiniCPM-o variants differ by this (their mels differ by ~1.6-1.9 % rel L2
  from chunk 3 on, token2wav-synthesis notes). `PER_RATE` keeps exactly the prompt's tokens and the
  last 50 tokens (= the last 100 mel frames of the mel-rate layers).

Lookahead variants for `setup_cache` (the 3 tokens appended to the prompt tokens):
- `Lookahead.PROMPT_HEAD`: `prompt_tokens[:, :3]` (Step-Audio2 `token2wav.py`).
- `Lookahead.SILENCE`: three silence tokens 4218 (MiniCPM-o 4.5 builds).
- `Lookahead.INCLUDED`: the caller already appended them (the reference signature).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

#: Frames kept after the prompt when trimming (reference constant).
CACHE_TAIL_FRAMES = 100
#: Tokens of the next chunk fed as lookahead with a non-final chunk (the encoder's `pre_lookahead_len`).
PRE_LOOKAHEAD_TOKENS = 3
#: MiniCPM-o's silence token used as lookahead.
SILENCE_TOKEN = 4218


class Lookahead(enum.Enum):
    INCLUDED = "included"
    PROMPT_HEAD = "prompt_head"
    SILENCE = "silence"


class ConformerTrim(enum.Enum):
    """How a stream trims the conformer attention cache after each chunk (table in the module docstring)."""

    NONE = "none"
    PROMPT_PLUS_TAIL = "prompt_plus_tail"
    PER_RATE = "per_rate"


@dataclass
class FlowStreamCache:
    """State carried between `inference_chunk` calls. Tensors are owned (never views of scratch buffers)."""

    conformer_cnn_cache: torch.Tensor
    conformer_att_cache: torch.Tensor
    estimator_cnn_cache: torch.Tensor
    estimator_att_cache: torch.Tensor
    #: P: prompt mel frames (the trimming rule keeps these).
    prompt_frames: int
    n_timesteps: int
    conformer_trim: ConformerTrim = ConformerTrim.NONE
    tail_frames: int = CACHE_TAIL_FRAMES

    @property
    def estimator_frames(self) -> int:
        """Frames in the estimator cache; also the noise offset of the next chunk."""
        return int(self.estimator_att_cache.size(4))

    @property
    def conformer_frames(self) -> int:
        return int(self.conformer_att_cache.size(3))

    def as_dict(self) -> dict[str, torch.Tensor]:
        """The reference's cache dict (keys `conformer_cnn_cache`, ...); same tensors, not copies."""
        return {
            "conformer_cnn_cache": self.conformer_cnn_cache,
            "conformer_att_cache": self.conformer_att_cache,
            "estimator_cnn_cache": self.estimator_cnn_cache,
            "estimator_att_cache": self.estimator_att_cache,
        }


def trim_time(cache: torch.Tensor, dim: int, keep_head: int, keep_tail: int) -> torch.Tensor:
    """If `cache.size(dim) > keep_head + keep_tail`: cat of the first `keep_head` and last `keep_tail`
    entries along `dim` (a new tensor); otherwise `cache` itself."""
    if cache.size(dim) <= keep_head + keep_tail:
        return cache
    length = cache.size(dim)
    return torch.cat([cache.narrow(dim, 0, keep_head), cache.narrow(dim, length - keep_tail, keep_tail)], dim=dim)


def trim_conformer_cache(
    cache: torch.Tensor,
    rule: ConformerTrim,
    prompt_frames: int,
    tail_frames: int,
    *,
    token_layers: int,
    stride: int,
) -> torch.Tensor:
    """The conformer att cache `(layers, 1, H, t, 2 d_k)` after a chunk, trimmed by `rule` (module docstring).

    `token_layers`: how many leading layers run at the token rate (stored tiled `stride` times along
    time); `prompt_frames` (P) and `tail_frames` are mel frames. Returns `cache` itself when nothing
    is cut. `PER_RATE` needs P and the tail to be multiples of `stride` (P is `stride` x prompt tokens
    by construction of `setup_cache`).
    """
    if rule is ConformerTrim.NONE or cache.size(3) <= prompt_frames + tail_frames:
        return cache
    if rule is ConformerTrim.PROMPT_PLUS_TAIL:
        return trim_time(cache, 3, prompt_frames, tail_frames)
    if rule is not ConformerTrim.PER_RATE:
        raise ValueError(f"unknown conformer trim rule {rule!r}")
    if prompt_frames % stride or tail_frames % stride or cache.size(3) % stride:
        raise ValueError(
            f"ConformerTrim.PER_RATE: prompt frames {prompt_frames}, tail {tail_frames} and cache length "
            f"{cache.size(3)} must be multiples of the token-to-mel ratio {stride}"
        )
    tokens = cache[:token_layers].narrow(3, 0, cache.size(3) // stride)  # one copy of the tiled cache
    tokens = trim_time(tokens, 3, prompt_frames // stride, tail_frames // stride)
    mels = trim_time(cache[token_layers:], 3, prompt_frames, tail_frames)
    return torch.cat([tokens.repeat(1, 1, 1, stride, 1), mels], dim=0)


def with_lookahead(prompt_tokens: torch.Tensor, lookahead: Lookahead, pre_lookahead_len: int = 3) -> torch.Tensor:
    """Append the lookahead tokens of `lookahead` to `prompt_tokens (1, T)`."""
    if lookahead is Lookahead.INCLUDED:
        return prompt_tokens
    if lookahead is Lookahead.PROMPT_HEAD:
        if prompt_tokens.size(1) < pre_lookahead_len:
            raise ValueError(
                f"flow setup_cache: Lookahead.PROMPT_HEAD needs at least {pre_lookahead_len} prompt tokens, "
                f"got {prompt_tokens.size(1)}"
            )
        tail = prompt_tokens[:, :pre_lookahead_len]
    else:
        tail = torch.full(
            (prompt_tokens.size(0), pre_lookahead_len),
            SILENCE_TOKEN,
            dtype=prompt_tokens.dtype,
            device=prompt_tokens.device,
        )
    return torch.cat([prompt_tokens, tail], dim=1)
