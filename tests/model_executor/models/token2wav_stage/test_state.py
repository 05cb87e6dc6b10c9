# SPDX-License-Identifier: Apache-2.0
"""Stream admission rules: every chunk is checked against its request's stream before anything runs."""

from __future__ import annotations

import pytest

from vllm_omni_token2wav.model_executor.models.token2wav_stage.contract import ChunkMeta
from vllm_omni_token2wav.model_executor.models.token2wav_stage.state import (
    Admission,
    ChunkRejectedError,
    Ended,
    StreamState,
    admit,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.voice import VoiceRequest

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

ALICE = VoiceRequest(key="ref:alice", label="reference audio (alice)")
BOB = VoiceRequest(key="ref:bob", label="reference audio (bob)")


def _state(epoch: int = 1, seq: int = 4, voice: str = "ref:alice") -> StreamState:
    return StreamState("k", "req-7", epoch, seq, voice, voice=object(), caches=object())


def test_a_new_stream_starts_at_chunk_zero() -> None:
    assert admit("req-7", ChunkMeta(0, 2, False), ALICE, None, None) == Admission(None, 2, 0)
    assert admit("req-7", ChunkMeta(None, None, False), None, None, None) == Admission(None, 0, 0)
    with pytest.raises(
        ChunkRejectedError, match=r"request req-7: the first chunk of a stream must have chunk_seq 0, got 3"
    ):
        admit("req-7", ChunkMeta(3, 0, False), None, None, None)


def test_the_next_chunk_continues_its_stream() -> None:
    prev = _state()
    assert admit("req-7", ChunkMeta(5, 1, False), None, prev, None) == Admission(prev, 1, 5)
    assert admit("req-7", ChunkMeta(None, None, True), ALICE, prev, None) == Admission(prev, 1, 5)  # implicit next


@pytest.mark.parametrize(
    ("chunk", "voice", "message"),
    [
        (ChunkMeta(4, 1, False), None, r"request req-7: repeated chunk: expected chunk_seq 5 \(epoch 1\), got 4"),
        (ChunkMeta(2, 1, False), None, r"repeated chunk: expected chunk_seq 5 \(epoch 1\), got 2"),
        (ChunkMeta(7, 1, False), None, r"request req-7: skipped chunk: expected chunk_seq 5 \(epoch 1\), got 7"),
        (
            ChunkMeta(5, 0, False),
            None,
            r"request req-7: stale cache_epoch 0; its stream is at epoch 1 \(expected >= 1\)",
        ),
        (ChunkMeta(3, 2, False), None, r"request req-7: a new cache_epoch 2 must start at chunk_seq 0, got 3"),
        (
            ChunkMeta(5, 1, False),
            BOB,
            r"request req-7: voice changed mid-stream: .*'ref:alice'.*reference audio \(bob\)",
        ),
    ],
)
def test_out_of_order_stale_and_voice_changing_chunks_are_rejected(
    chunk: ChunkMeta, voice: VoiceRequest | None, message: str
) -> None:
    with pytest.raises(ChunkRejectedError, match=message):
        admit("req-7", chunk, voice, _state(), None)


def test_a_new_epoch_restarts_the_stream() -> None:
    assert admit("req-7", ChunkMeta(0, 2, False), BOB, _state(), None) == Admission(None, 2, 0)


def test_chunks_after_the_last_or_after_eviction_are_rejected_with_the_reason() -> None:
    done = Ended(epoch=0, chunk_seq=3, reason="had its last chunk (chunk_seq 3)")
    with pytest.raises(ChunkRejectedError, match=r"chunk_seq 4 of epoch 0 arrived after its stream had its last chunk"):
        admit("req-7", ChunkMeta(4, 0, False), None, None, done)
    with pytest.raises(ChunkRejectedError, match="after its stream had its last chunk"):
        admit("req-7", ChunkMeta(None, None, False), None, None, done)  # Step-Audio2: no chunk_seq sent
    evicted = Ended(epoch=1, chunk_seq=2, reason="was evicted (idle 700 s > 600 s)")
    with pytest.raises(ChunkRejectedError, match=r"after its stream was evicted \(idle 700 s > 600 s\)"):
        admit("req-7", ChunkMeta(3, 1, False), None, None, evicted)
    with pytest.raises(ChunkRejectedError, match="stale cache_epoch 0; its stream was at epoch 1"):
        admit("req-7", ChunkMeta(0, 0, False), None, None, evicted)
    assert admit("req-7", ChunkMeta(0, 2, False), None, None, evicted) == Admission(None, 2, 0)
