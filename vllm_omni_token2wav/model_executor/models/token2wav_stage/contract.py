# SPDX-License-Identifier: Apache-2.0
"""The engine's calling convention, spoken in one place: a step in, `Segment`s out; results in, `OmniOutput` out.

vLLM-Omni's generation runner calls a code2wav stage once per scheduler step with the tokens of
every scheduled request in ONE flat `input_ids` (int32 on CPU, seen with the real engine; any integer
dtype is accepted, a float or bool one is that segment's error), `kwargs["seq_token_counts"]` to
split it, `kwargs["request_ids"]` (the model sets `requires_request_ids`) and one
`runtime_additional_information` dict per request (the team's stage-contract notes, outside this repository; where the
real engine differs, this module follows the engine). This module turns that into plain `Segment`
records and nothing else: no state, no models.

What the engine itself puts in every dict (never producer payload): `global_request_id` (a
one-element list), `omni_final_stage_id` (an int), `generated_len`, and, on some paths, `request_id`,
`req_id`, a `meta` holding only runner bookkeeping (`request_id`, `num_processed_tokens`,
`resumable`), plus whatever else a later engine adds. So "does this dict carry producer payload" is
decided from what producers SEND (`carries_payload`, a positive list), never from a list of runner keys.

Reading a segment's dict (`meta.*` may arrive nested under `meta` or flattened as `meta.<key>`, or
top-level as in a request without a producer; values may be Python scalars, one-element lists or
0-d/1-element tensors):

| field          | from                                                                               |
|----------------|------------------------------------------------------------------------------------|
| state key      | `request_ids[i]`, else `global_request_id`, else `meta.request_id` / `req_id`,     |
|                | else the segment index                                                             |
| request id     | (in messages) `meta.request_id` / `req_id`, else `global_request_id`, else the key |
| tokens         | `codes.audio`, else the segment of `input_ids`; `meta.code_flat_numel` is the      |
|                | true count (0: the runner inserted a placeholder token, so no tokens)              |
| chunk position | `meta.chunk_seq`, `meta.cache_epoch` (absent: the stream's next chunk / epoch)     |
| last chunk     | the family's marker (`meta.last_chunk`, or Step-Audio2's `left_context_size`)      |
| prefix offset  | CosyVoice3: `meta.left_context_size`; the chunk keeps `tokens[offset:]`             |
| voice          | `codes.ref` + `meta.ref_audio_sr`, else top-level `ref_audio` + `ref_audio_sr`,   |
|                | else `meta.prompt_wav` / `prompt_wav` (absent: keep the stream's / the default)    |
|                | (CosyVoice3: the family's `voice_reader`, `embed.*` prompt conditioning)            |
| noise seed     | `meta.seed` / `seed` (absent: derived from the request id and epoch)               |

Producer payload (`carries_payload`): a non-None `codes` / `codes.*` value, any `embed` / `embed.*`
value, a producer meta key (`PRODUCER_META_KEYS`: what upstream's `tts2code2wav_*`,
`thinker2token2wav_*` and `talker2code2wav_*` / `text2flow_*` processors put in `meta`), or a voice
key of a request without a producer (`REQUEST_VOICE_KEYS`).

Which kind a segment is (`SegmentKind`), by the pipeline's mode (`async_chunk`, the stage option read
from vLLM-Omni's `model_config.async_chunk`):

| segment                                | async_chunk (the pipeline streams)  | sync (code2wav alone, sync path) |
|----------------------------------------|-------------------------------------|----------------------------------|
| no runtime information at all, or      | profiling pass: every output empty, nothing computed or loaded        |
| `dummy_run=True` / `is_profile=True`   |                                     |                                  |
| no producer payload                    | PLACEHOLDER (the pre-warm step      | its tokens are the whole request |
|                                        | before the first codec window)      | (as "payload without stream      |
|                                        |                                     | meta" below), unless they are    |
|                                        |                                     | empty or all zero: PLACEHOLDER   |
| payload with stream meta               | CHUNK                               | CHUNK                            |
| payload without stream meta            | MiniCPM-o: a one-chunk stream (CHUNK, last); Step-Audio2 and          |
|                                        | CosyVoice3: a whole utterance (WHOLE)                                 |
| CosyVoice3 token-less payload with     | CHUNK: the terminal chunk of its stream                               |
| `finished`                             |                                     |                                  |

A segment whose dict cannot be read (not a dict, a `meta` that is not a mapping, float token ids,
a `code_flat_numel` that disagrees, ...) gets `error` set naming the request, the key, expected vs
got; the engine returns the message for it and serves the others. A step whose shape breaks the
contract itself (counts not summing to the tokens, a dict count different from the segment count)
is the runner's bug and raises.

Requests without a producer (code2wav alone, docs/design/token2wav_stage.md): the prompt is the
codec token ids, `{"prompt_token_ids": [...], "additional_information": {...}}`, with the voice
top-level in `additional_information`: `ref_audio` (a mono float waveform: list, tensor or array)
+ `ref_audio_sr` (int), or `prompt_wav` (a path), or neither (the default voice); CosyVoice3 also
takes its `embed.*` conditioning or `ref_audio` + `speech_token`; optional `seed`. The engine may
hand values back wrapped in one-element lists; every reader unwraps them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vllm_omni_token2wav.model_executor.models.output_templates import omni_output_class
from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import ERROR_KEY, encode_error
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import FamilySpec
from vllm_omni_token2wav.model_executor.models.token2wav_stage.fields import codes_value, meta_value, scalar
from vllm_omni_token2wav.model_executor.models.token2wav_stage.voice import VoiceRequest, request_voice

OUTPUT_SAMPLE_RATE = 24_000
#: Meta keys only a producer sends (upstream's stage input processors for the three families).
PRODUCER_META_KEYS = frozenset(
    {
        "cache_epoch",
        "chunk_seq",
        "code_flat_numel",
        "finished",
        "last_chunk",
        "left_context_size",
        "stream_finished",
        "prompt_cache_id",
        "prompt_wav",
        "ref_audio_sr",
    }
)
#: Top-level keys of a request without a producer that name its voice (module docstring).
REQUEST_VOICE_KEYS = frozenset({"ref_audio", "ref_audio_sr", "prompt_wav", "speech_token"})


class SegmentKind(enum.Enum):
    PLACEHOLDER = "placeholder"
    CHUNK = "chunk"
    WHOLE = "whole"


@dataclass(frozen=True)
class ChunkMeta:
    """A stream chunk's position; None means "not sent" (the stream's next chunk / current epoch)."""

    chunk_seq: int | None
    epoch: int | None
    last: bool


@dataclass(frozen=True)
class Segment:
    """One request's part of a step, as read from the contract (not yet checked against its stream)."""

    index: int
    key: str
    request_id: str
    kind: SegmentKind
    tokens: tuple[int, ...] = ()
    chunk: ChunkMeta | None = None
    voice: VoiceRequest | None = None
    seed: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class StepInput:
    segments: list[Segment]
    profiling: bool
    device: torch.device


@dataclass(frozen=True)
class SegmentResult:
    """What a segment produced: its new audio (maybe empty) or an error message."""

    audio: torch.Tensor | None = None
    error: str | None = None


def _has_section(info: Mapping[str, Any], section: str) -> bool:
    """Whether `info` holds a non-None value under `section` (nested `info[section][k]` or flattened `section.k`)."""
    nested = info.get(section)
    if isinstance(nested, Mapping) and any(v is not None for v in nested.values()):
        return True
    prefix = f"{section}."
    return any(isinstance(k, str) and k.startswith(prefix) and v is not None for k, v in info.items())


def carries_payload(info: Mapping[str, Any]) -> bool:
    """Whether the dict holds anything a producer (or a request without one) sent (module docstring).

    A positive list: `codes` / `codes.*`, `embed` / `embed.*`, a `PRODUCER_META_KEYS` key, a
    `REQUEST_VOICE_KEYS` key. Runner bookkeeping (`global_request_id`, `omni_final_stage_id`,
    `generated_len`, `request_id`, `req_id`, a `meta` of bookkeeping, and anything a later engine
    adds) never makes a dict payload.
    """
    if _has_section(info, "codes") or _has_section(info, "embed"):
        return True
    if any(meta_value(info, key) is not None for key in PRODUCER_META_KEYS):
        return True
    return any(info.get(key) is not None for key in REQUEST_VOICE_KEYS)


def _check_integer_dtype(kind: str, dtype: Any, what: str) -> None:
    if kind not in "iu":
        raise ValueError(f"{what} must hold integer token ids, got dtype {dtype}")


def _tensor_kind(t: torch.Tensor) -> str:
    if t.dtype == torch.bool:
        return "b"
    return "f" if t.dtype.is_floating_point or t.dtype.is_complex else "i"


def _token_list(value: Any, what: str) -> list[int]:
    if isinstance(value, torch.Tensor):
        _check_integer_dtype(_tensor_kind(value), value.dtype, what)
        return [int(v) for v in value.reshape(-1).tolist()]
    if isinstance(value, np.ndarray):
        _check_integer_dtype(value.dtype.kind, value.dtype, what)
        return [int(v) for v in value.reshape(-1).tolist()]
    if isinstance(value, list | tuple):
        if not all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in value):
            raise ValueError(f"{what} must be a list of integer token ids")
        return [int(v) for v in value]
    raise ValueError(f"{what} must be a tensor or list of token ids, got {type(value).__name__}")


def split_counts(total: int, counts: Any) -> list[int]:
    """`seq_token_counts` as ints that sum to the number of input ids (None: one segment of everything)."""
    if counts is None:
        return [total]
    if isinstance(counts, torch.Tensor):
        counts = counts.reshape(-1).tolist()
    if not isinstance(counts, Sequence) or isinstance(counts, str | bytes):
        raise ValueError(f"seq_token_counts must be a list of ints, got {type(counts).__name__}")
    values = [int(c) for c in counts]
    if any(c < 0 for c in values) or sum(values) != total:
        raise ValueError(f"seq_token_counts {values} must be >= 0 and sum to the {total} input ids of the step")
    return values


def _identity(index: int, key: str | None, info: Mapping[str, Any]) -> tuple[str, str]:
    """(state key, request id for messages) of a segment (module docstring)."""
    named = str(scalar(meta_value(info, "request_id"), "") or scalar(meta_value(info, "req_id"), "") or "")
    global_id = str(scalar(info.get("global_request_id"), "") or "")
    key = key or global_id or named or str(index)
    return key, named or global_id or key


def _check_meta(info: Mapping[str, Any]) -> None:
    meta = info.get("meta")
    if meta is not None and not isinstance(meta, Mapping):
        raise ValueError(
            f"meta is a {type(meta).__name__} ({meta!r:.60}), expected a dict of stream fields (chunk_seq, "
            "cache_epoch, last_chunk, ...) or flattened meta.<key> entries"
        )


def _parse_segment(
    index: int,
    key: str | None,
    ids: list[int],
    ids_error: str | None,
    info: Any,
    family: FamilySpec,
    async_chunk: bool,
) -> Segment:
    if not isinstance(info, Mapping):
        return Segment(
            index,
            key or str(index),
            key or str(index),
            SegmentKind.PLACEHOLDER,
            error=f"runtime_additional_information[{index}] is a {type(info).__name__}, expected a dict",
        )
    key, request_id = _identity(index, key, info)
    try:
        _check_meta(info)
        if not carries_payload(info) and (async_chunk or not any(ids)):
            return Segment(index, key, request_id, SegmentKind.PLACEHOLDER)
        audio = codes_value(info, "audio")
        if audio is not None:
            tokens = _token_list(audio, "codes.audio")
        elif ids_error is not None:
            raise ValueError(ids_error)
        else:
            tokens = list(ids)
        numel = scalar(meta_value(info, "code_flat_numel"))
        if numel is not None:
            numel = int(numel)
            if numel == 0:
                tokens = []  # the runner's placeholder token for an empty chunk
            elif numel != len(tokens):
                raise ValueError(f"meta.code_flat_numel says {numel} tokens but the segment carries {len(tokens)}")
        offset = scalar(meta_value(info, family.prefix_offset_key)) if family.prefix_offset_key else None
        if offset is not None:
            offset = int(offset)
            if not 0 <= offset <= len(tokens):
                raise ValueError(
                    f"meta.{family.prefix_offset_key} is {offset} but the chunk's prefix has {len(tokens)} tokens"
                )
            tokens = tokens[offset:]  # the prefix's tokens before the offset were sent with earlier chunks
        voice = family.voice_reader(info) if family.voice_reader is not None else request_voice(info)
        seed = scalar(meta_value(info, "seed"))
        seed = None if seed is None else int(seed)
        marker = meta_value(info, family.last_chunk_key)
        seq = scalar(meta_value(info, "chunk_seq"))
        epoch = scalar(meta_value(info, "cache_epoch"))
        stream_meta = marker is not None or seq is not None or epoch is not None or offset is not None
        ended = family.end_marker_key is not None and bool(scalar(meta_value(info, family.end_marker_key), False))
        if not stream_meta and not tokens and ended:
            chunk = ChunkMeta(chunk_seq=None, epoch=None, last=True)  # a terminal chunk without tokens
            return Segment(index, key, request_id, SegmentKind.CHUNK, (), chunk, voice, seed)
        if not stream_meta and family.whole_without_stream_meta:
            return Segment(index, key, request_id, SegmentKind.WHOLE, tokens=tuple(tokens), voice=voice, seed=seed)
        last = family.is_last(scalar(marker)) if marker is not None else not stream_meta
        chunk = ChunkMeta(
            chunk_seq=None if seq is None else int(seq), epoch=None if epoch is None else int(epoch), last=last
        )
        if (chunk.chunk_seq is not None and chunk.chunk_seq < 0) or (chunk.epoch is not None and chunk.epoch < 0):
            raise ValueError(f"negative stream position: chunk_seq {chunk.chunk_seq}, cache_epoch {chunk.epoch}")
        return Segment(index, key, request_id, SegmentKind.CHUNK, tuple(tokens), chunk, voice, seed)
    except (TypeError, ValueError) as exc:
        return Segment(index, key, request_id, SegmentKind.PLACEHOLDER, error=f"request {request_id}: {exc}")


def parse_step(
    input_ids: torch.Tensor | None,
    runtime_additional_information: Sequence[Any] | None,
    kwargs: Mapping[str, Any],
    family: FamilySpec,
    *,
    async_chunk: bool = False,
) -> StepInput:
    """Split one `forward` call into segments (see the module docstring for every rule).

    `async_chunk`: the pipeline streams chunks (a segment without producer payload is a placeholder);
    False: each request's tokens are its whole input (code2wav alone, or a pipeline's sync path).
    """
    ids = input_ids if isinstance(input_ids, torch.Tensor) else torch.empty(0, dtype=torch.long)
    device = ids.device
    counts = split_counts(int(ids.numel()), kwargs.get("seq_token_counts"))
    profiling = (
        runtime_additional_information is None or bool(kwargs.get("dummy_run")) or bool(kwargs.get("is_profile"))
    )
    request_ids = kwargs.get("request_ids")
    if request_ids is not None and len(request_ids) != len(counts):
        raise ValueError(f"request_ids names {len(request_ids)} requests but seq_token_counts has {len(counts)}")
    if profiling:
        keys = [str(r) for r in request_ids] if request_ids is not None else [str(i) for i in range(len(counts))]
        segments = [Segment(i, k, k, SegmentKind.PLACEHOLDER) for i, k in enumerate(keys)]
        return StepInput(segments, True, device)
    infos = list(runtime_additional_information or [])
    if len(infos) != len(counts):
        raise ValueError(
            f"runtime_additional_information has {len(infos)} entries but the step has {len(counts)} segments "
            f"(seq_token_counts {counts})"
        )
    try:
        _check_integer_dtype(_tensor_kind(ids), ids.dtype, "input_ids")
        ids_error = None
    except ValueError as exc:
        ids_error = str(exc)  # only an error for segments whose tokens come from input_ids
    flat = ids.reshape(-1).tolist()  # one host copy of the step's token ids
    segments, start = [], 0
    for i, (count, info) in enumerate(zip(counts, infos, strict=True)):
        key = str(request_ids[i]) if request_ids is not None else None
        segments.append(_parse_segment(i, key, flat[start : start + count], ids_error, info, family, async_chunk))
        start += count
    return StepInput(segments, False, device)


def build_output(results: Sequence[SegmentResult], device: torch.device, output_key: str = "model_outputs") -> Any:
    """`OmniOutput` with one entry per segment, in input order: audio (empty where nothing is ready), rate, error.

    Every list entry is a tensor (the runner calls `.detach()` on each): the audio under `output_key` (the
    family's `FamilySpec.output_key`: `model_outputs`, or `audio` for CosyVoice3) 1-D float32,
    `sr` a 0-d int32, `token2wav_error` the UTF-8 message as 1-D uint8, empty without an error
    (`errors.py`). The class is upstream's `OmniOutput` when vLLM-Omni runs us (`output_templates.py`).
    """
    empty = torch.empty(0, dtype=torch.float32, device=device)
    audio = [empty if r.audio is None else r.audio.reshape(-1).to(torch.float32) for r in results]
    return omni_output_class()(
        text_hidden_states=None,
        multimodal_outputs={
            output_key: audio,
            "sr": [torch.tensor(OUTPUT_SAMPLE_RATE, dtype=torch.int32) for _ in results],
            ERROR_KEY: [encode_error(r.error) for r in results],
        },
    )


__all__ = [
    "OUTPUT_SAMPLE_RATE",
    "PRODUCER_META_KEYS",
    "REQUEST_VOICE_KEYS",
    "ChunkMeta",
    "Segment",
    "SegmentKind",
    "SegmentResult",
    "StepInput",
    "build_output",
    "carries_payload",
    "codes_value",
    "meta_value",
    "parse_step",
    "request_voice",
    "scalar",
    "split_counts",
]
