# SPDX-License-Identifier: Apache-2.0
"""The producer / runner emulation the concurrency benchmark and the stage tests drive the stage with.

References are the producers' rules written out here (vLLM-Omni 0.30 `stage_input_processors`):
MiniCPM-o sends `[3 context | 25 new]` with silence context first and context + rest last;
Step-Audio2 sends 25 + 3 and advances by 25, then the rest; CosyVoice3's talker sends the whole
prefix `[0, offset + hop + 3)` with `left_context_size = offset`, hops 25 + pad, 50, 100, 100, ...
"""

from __future__ import annotations

import pytest
import torch

from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import (
    ChunkPayload,
    ProducerStream,
    all_chunks,
    forward_inputs,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.contract import SegmentKind, parse_step
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import COSYVOICE3, MINICPMO_4_5, STEP_AUDIO2

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def _minicpmo_reference(tokens: list[int]) -> list[tuple[list[int], bool]]:
    out, context, start = [], [4218] * 3, 0
    while len(tokens) - start >= 25:
        new = tokens[start : start + 25]
        out.append(([*context, *new], False))
        context, start = new[-3:], start + 25
    rest = tokens[start:]
    out.append(([*context, *rest] if (rest or start) else [], True))
    return out


def _step_audio2_reference(tokens: list[int]) -> list[tuple[list[int], bool]]:
    out, start = [], 0
    while len(tokens) - start >= 28:
        out.append((tokens[start : start + 28], False))
        start += 25
    out.append((tokens[start:], True))
    return out


@pytest.mark.parametrize("n", [0, 3, 24, 25, 28, 50, 53, 61, 100])
def test_chunks_follow_each_producer(n: int) -> None:
    tokens = list(range(1000, 1000 + n))
    for family, reference in ((MINICPMO_4_5, _minicpmo_reference), (STEP_AUDIO2, _step_audio2_reference)):
        got = [(list(c.tokens), c.last) for c in all_chunks(ProducerStream("r", tokens, family))]
        assert got == reference(tokens), family.name
        chunks = all_chunks(ProducerStream("r", tokens, family))
        assert [c.chunk_seq for c in chunks] == list(range(len(chunks)))


def test_a_voice_rides_on_the_first_chunk_only() -> None:
    voice = (torch.zeros(100).numpy(), 16000)
    chunks = all_chunks(ProducerStream("r", list(range(60)), MINICPMO_4_5, voice=voice))
    assert chunks[0].voice is voice and all(c.voice is None for c in chunks[1:])


def test_forward_inputs_are_what_the_runner_hands_the_stage() -> None:
    payloads = [
        ChunkPayload("a", (1, 2, 3), False, 4, 1),
        ChunkPayload("b", (), True, 2, 0),
        ChunkPayload("c", (7, 8), True, 0, 0, voice=(torch.ones(10).numpy() * 0.1, 16000)),
    ]
    ids, kwargs = forward_inputs(payloads, MINICPMO_4_5)
    assert ids.tolist() == [1, 2, 3, 0, 7, 8] and kwargs["seq_token_counts"] == [3, 1, 2]  # placeholder for "b"
    assert kwargs["request_ids"] == ["a", "b", "c"]
    meta = kwargs["runtime_additional_information"][0]["meta"]
    assert meta == {"request_id": "a", "chunk_seq": 4, "cache_epoch": 1, "last_chunk": False, "code_flat_numel": 3}
    assert kwargs["runtime_additional_information"][2]["meta"]["ref_audio_sr"] == 16000
    for flatten in (False, True):
        ids, kwargs = forward_inputs(payloads, MINICPMO_4_5, flatten=flatten)
        segments = parse_step(ids, kwargs.pop("runtime_additional_information"), kwargs, MINICPMO_4_5).segments
        assert [s.tokens for s in segments] == [(1, 2, 3), (), (7, 8)]
        assert segments[2].voice is not None and segments[1].chunk.last  # type: ignore[union-attr]
    s2_ids, s2 = forward_inputs(payloads[:1], STEP_AUDIO2)
    assert s2["runtime_additional_information"][0]["meta"] == {"left_context_size": 0}
    seg = parse_step(s2_ids, s2["runtime_additional_information"], s2, STEP_AUDIO2).segments[0]
    assert seg.kind is SegmentKind.CHUNK and seg.chunk is not None and seg.chunk.chunk_seq is None


def _cosyvoice3_reference(n: int, prompt: int) -> list[tuple[int, int | None, bool]]:
    """(prefix length, offset, last) of each chunk: talker2code2wav_async_chunk with chunk 25, max hop 100."""
    if n == 0:
        return [(0, None, True)]
    out, emitted, hop, first = [], 0, 25, True
    while True:
        this = hop + ((-prompt) % 25 if first else 0)
        if n - emitted < this + 3:
            break
        out.append((emitted + this + 3, emitted, False))
        emitted, hop, first = emitted + this, min(100, hop * 2), False
    out.append((n, emitted, True))
    return out


@pytest.mark.parametrize(("n", "prompt"), [(0, 10), (20, 0), (28, 0), (60, 7), (300, 33), (500, 75)])
def test_cosyvoice3_chunks_follow_its_talker(n: int, prompt: int) -> None:
    tokens = list(range(100, 100 + n))
    embed = {"speech_token": torch.zeros(1, prompt, dtype=torch.long)}
    chunks = all_chunks(ProducerStream("r", tokens, COSYVOICE3, embed=embed, prompt_tokens=prompt))
    assert [(len(c.tokens), c.offset, c.last) for c in chunks] == _cosyvoice3_reference(n, prompt)
    assert all(list(c.tokens) == tokens[: len(c.tokens)] for c in chunks)  # always the whole prefix
    assert chunks[0].embed is embed and all(c.embed is None for c in chunks[1:])
    _, kwargs = forward_inputs(chunks[:1], COSYVOICE3)
    (info,) = kwargs["runtime_additional_information"]
    assert info["meta"]["req_id"] == ["r"] and info["embed"] is not embed and "speech_token" in info["embed"]
