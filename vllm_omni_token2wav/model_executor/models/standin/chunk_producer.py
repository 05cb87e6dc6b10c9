# SPDX-License-Identifier: Apache-2.0
"""The stand-in talker: the two sides around a Token2Wav stage, emulated (a producer chunking codec tokens, and
the runner's call).

The concurrency benchmark (`vllm_omni_token2wav/benchmarks/token2wav_serve/run.py`, `bench token2wav-serve`),
the row-cost benchmark and the stage's tests drive the stage model exactly as vLLM-Omni does, without vLLM:
this module holds what that takes. It sits with the stand-in model folders (`standin/`) because it stands in
for the talker stage, as they stand in for the weights; it is not a benchmark.

- `ProducerStream`: one request's codec tokens cut into chunks the way the families' producers cut
  them (`stage_input_processors` in vLLM-Omni 0.30): MiniCPM-o sends `[3 context | 25 new]` (the
  first context is three silence codes 4218, the last chunk is the context plus whatever is left,
  possibly only the context); Step-Audio2 sends `25 + 3 lookahead` tokens and advances by 25, the
  last chunk being everything left. Either way consecutive chunks overlap by the flow's 3 lookahead
  tokens and the stage sees `chunk k + 1` start where `chunk k`'s lookahead started. CosyVoice3's
  talker (`talker2code2wav_async_chunk`) sends the whole prefix every time: `[0, offset + hop + 3)`
  with `left_context_size = offset`, hops 25 + pad (pad = the prompt's tokens up to a multiple of 25),
  then x2 up to 100; the last chunk is the whole sequence; a request without any token ends with an
  empty `finished` chunk; its prompt conditioning (`embed.*`) travels with the first chunk.
- `ChunkPayload` + `forward_inputs(payloads, family)`: one scheduler step as the generation runner
  hands it to `forward`: the tokens of all segments in ONE flat `input_ids` (a placeholder token
  for an empty chunk, with `code_flat_numel = 0`), `seq_token_counts`, `request_ids`, and per
  segment the producer's dict (`codes.audio`, `codes.ref`, `meta.*` in the family's vocabulary:
  MiniCPM-o's `request_id` / `chunk_seq` / `cache_epoch` / `last_chunk` / `code_flat_numel` /
  `ref_audio_sr`; Step-Audio2's `left_context_size` only; CosyVoice3's `req_id`,
  `left_context_size`, `stream_finished`, `finished` and `embed.*`), nested or flattened.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from vllm_omni_token2wav.model_executor.layers.flow.streaming import SILENCE_TOKEN
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import FamilySpec, producer_shape

CHUNK_TOKENS = 25
LOOKAHEAD_TOKENS = 3
#: CosyVoice3's talker: hops grow x2 from `CHUNK_TOKENS` up to this.
MAX_HOP_TOKENS = 4 * CHUNK_TOKENS


@dataclass(frozen=True)
class ChunkPayload:
    """One segment of a step: a request's chunk as its producer sent it."""

    request_id: str
    tokens: tuple[int, ...]
    last: bool
    chunk_seq: int = 0
    epoch: int = 0
    voice: tuple[np.ndarray, int] | None = None
    #: CosyVoice3: where the new part of the prefix starts (`left_context_size`); None for a terminal chunk
    offset: int | None = None
    #: CosyVoice3: the `embed.*` prompt payload (conditioning tensors, or `speech_token` with `voice`)
    embed: Mapping[str, Any] | None = None


@dataclass
class ProducerStream:
    """A request's codec tokens as a producer chunks them while the talker emits them (see the module docstring)."""

    request_id: str
    tokens: Sequence[int]
    family: FamilySpec
    voice: tuple[np.ndarray, int] | None = None
    epoch: int = 0
    consumed: int = 0
    sent: int = 0
    done: bool = False
    #: CosyVoice3: the prompt payload and the prompt's token count (its first hop pads to a chunk boundary)
    embed: Mapping[str, Any] | None = None
    prompt_tokens: int = 0
    _context: list[int] = field(default_factory=list)
    _hop: int = CHUNK_TOKENS

    def next_chunk(self, available: int, finished: bool) -> ChunkPayload | None:
        """The next chunk once `available` tokens exist (`finished`: the talker emitted them all), else None."""
        if self.done:
            return None
        available = min(available, len(self.tokens))
        offset = None
        chunking = producer_shape(self.family).chunking  # the family's `producer` record (its family.py)
        if chunking == "context_window":
            tokens, last = self._minicpmo(available, finished)
        elif chunking == "growing_prefix":
            tokens, last, offset = self._cosyvoice3(available, finished)
        else:
            tokens, last = self._step_audio2(available, finished)
        if tokens is None:
            return None
        payload = ChunkPayload(
            self.request_id,
            tuple(int(t) for t in tokens),
            last,
            self.sent,
            self.epoch,
            self.voice if self.sent == 0 else None,
            offset,
            self.embed if self.sent == 0 else None,
        )
        self.sent += 1
        self.done = last
        return payload

    def _minicpmo(self, available: int, finished: bool) -> tuple[list[int] | None, bool]:
        pending = available - self.consumed
        if not finished and pending < CHUNK_TOKENS:
            return None, False
        take = pending if finished else CHUNK_TOKENS
        new = list(self.tokens[self.consumed : self.consumed + take])
        context = self._context if self.consumed else [SILENCE_TOKEN] * LOOKAHEAD_TOKENS
        self.consumed += take
        out = [*context, *new] if new else (list(self._context) if self.consumed else [])
        self._context = out[-LOOKAHEAD_TOKENS:]
        return out, finished

    def _cosyvoice3(self, available: int, finished: bool) -> tuple[list[int] | None, bool, int | None]:
        emitted = self.consumed
        if finished:
            if available <= emitted:  # nothing at all was generated: an empty terminal chunk
                return [], True, None
            return list(self.tokens[:available]), True, emitted
        hop = self._hop + ((-self.prompt_tokens) % CHUNK_TOKENS if emitted == 0 else 0)
        if available - emitted < hop + LOOKAHEAD_TOKENS:
            return None, False, None
        self.consumed = emitted + hop
        self._hop = min(MAX_HOP_TOKENS, max(CHUNK_TOKENS, self._hop * 2))
        return list(self.tokens[: emitted + hop + LOOKAHEAD_TOKENS]), False, emitted

    def _step_audio2(self, available: int, finished: bool) -> tuple[list[int] | None, bool]:
        pending = available - self.consumed
        if finished:
            return list(self.tokens[self.consumed : available]), True
        if pending < CHUNK_TOKENS + LOOKAHEAD_TOKENS:
            return None, False
        out = list(self.tokens[self.consumed : self.consumed + CHUNK_TOKENS + LOOKAHEAD_TOKENS])
        self.consumed += CHUNK_TOKENS
        return out, False


def _meta(payload: ChunkPayload, family: FamilySpec) -> dict[str, Any]:
    """The producer's meta in the family's vocabulary: the keys its `producer.meta_keys` declares. A prefix
    producer (CosyVoice3) sends its offset and stream marker only with tokens (a token-less end has neither)."""
    values: dict[str, Any] = {
        "request_id": payload.request_id,
        "req_id": [payload.request_id],
        "chunk_seq": payload.chunk_seq,
        "cache_epoch": payload.epoch,
        "last_chunk": payload.last,
        "code_flat_numel": len(payload.tokens),
        "finished": payload.last,
        "stream_finished": payload.last,
        # where the new tokens start in a prefix producer's chunk; else Step-Audio2's last-chunk marker (1 = last)
        "left_context_size": payload.offset if family.prefix_offset_key == "left_context_size" else int(payload.last),
    }
    offset_only = {family.prefix_offset_key, "stream_finished"} if family.prefix_offset_key else set()
    sent = [k for k in producer_shape(family).meta_keys if payload.offset is not None or k not in offset_only]
    meta = {k: values[k] for k in sent}
    if payload.voice is not None:
        meta["ref_audio_sr"] = int(payload.voice[1])
    return meta


def forward_inputs(
    payloads: Sequence[ChunkPayload], family: FamilySpec, *, flatten: bool = False
) -> tuple[torch.Tensor, dict[str, Any]]:
    """`(input_ids, kwargs)` of one `forward` call holding `payloads` (see the module docstring)."""
    ids: list[int] = []
    counts: list[int] = []
    infos: list[dict[str, Any]] = []
    for payload in payloads:
        tokens = list(payload.tokens) or [0]  # the runner schedules an empty chunk on one placeholder token
        ids += tokens
        counts.append(len(tokens))
        codes: dict[str, Any] = {"audio": torch.tensor(payload.tokens, dtype=torch.long)}
        if payload.voice is not None:
            codes["ref"] = torch.as_tensor(payload.voice[0], dtype=torch.float32).reshape(-1)
        meta = _meta(payload, family)
        if payload.tokens == () and "code_flat_numel" not in meta:
            meta["code_flat_numel"] = 0
        embed = dict(payload.embed) if payload.embed is not None else {}
        if flatten:
            info = {f"codes.{k}": v for k, v in codes.items()} | {f"meta.{k}": v for k, v in meta.items()}
            info |= {f"embed.{k}": v for k, v in embed.items()}
        else:
            info = {"codes": codes, "meta": meta} | ({"embed": embed} if embed else {})
        infos.append(info)
    kwargs = {
        "runtime_additional_information": infos,
        "seq_token_counts": counts,
        "request_ids": [p.request_id for p in payloads],
    }
    return torch.tensor(ids, dtype=torch.long), kwargs


def all_chunks(stream: ProducerStream) -> list[ChunkPayload]:
    """Every chunk of a request whose talker has finished (what a whole reply streams as)."""
    out = []
    while (chunk := stream.next_chunk(len(stream.tokens), False)) is not None:
        out.append(chunk)
    last = stream.next_chunk(len(stream.tokens), True)
    if last is not None:
        out.append(last)
    return out


__all__ = [
    "CHUNK_TOKENS",
    "LOOKAHEAD_TOKENS",
    "MAX_HOP_TOKENS",
    "ChunkPayload",
    "ProducerStream",
    "all_chunks",
    "forward_inputs",
]
