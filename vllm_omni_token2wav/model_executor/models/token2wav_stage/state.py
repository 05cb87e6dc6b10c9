# SPDX-License-Identifier: Apache-2.0
"""Per-request stream state as immutable data, and the rules a chunk must satisfy against it.

A request's stream is a `StreamState` (frozen): its position (`epoch`, last committed `chunk_seq`),
its voice, and the backend's caches (for the CosyVoice2 flow + HiFT: `StreamCaches`). A chunk is
computed from the state it finds and produces a NEW state, committed only when the whole chunk
succeeded; a failed chunk leaves the stream exactly as it was and touches no other stream.

`admit` decides, before anything runs, whether a chunk may proceed (rules of vLLM-Omni's MiniCPM-o
stage, plus the ones a serving engine needs):

| situation                                        | decision                                         |
|--------------------------------------------------|--------------------------------------------------|
| no stream, chunk_seq 0 (or not sent)             | new stream                                       |
| no stream, chunk_seq != 0                        | error: a first chunk must have chunk_seq 0       |
| stream, cache_epoch < its epoch                  | error: stale epoch (expected >= E)               |
| stream, cache_epoch > its epoch                  | restart (the old state is dropped) if chunk_seq  |
|                                                  | is 0, else error                                 |
| stream, same epoch, chunk_seq != previous + 1    | error: repeated or skipped chunk (expected N)    |
| stream, the chunk names another voice            | error: voice changed mid-stream                  |
| the stream ended (last chunk / evicted), same    | error: a chunk after the last (or after eviction,|
| epoch                                            | with the reason)                                 |

Producers that send no `chunk_seq` / `cache_epoch` (Step-Audio2's) get the implicit "next chunk of
the current epoch"; the ordering checks then cannot fire, the others still do.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_omni_token2wav.model_executor.models.token2wav_stage.contract import ChunkMeta
from vllm_omni_token2wav.model_executor.models.token2wav_stage.voice import VoiceRequest


class ChunkRejectedError(ValueError):
    """A segment cannot run against its stream; the message names the request, expected and actual values."""


@dataclass(frozen=True)
class StreamState:
    """One request's stream after its last committed chunk."""

    key: str
    request_id: str
    epoch: int
    chunk_seq: int
    voice_key: str
    voice: object  # the backend's prepared voice (shared between streams, read-only)
    caches: object  # the backend's per-stream caches (immutable; replaced by every chunk)
    samples_emitted: int = 0
    tokens: int = 0  # codec tokens the stream has received (what its memory estimate scales with)


@dataclass(frozen=True)
class Ended:
    """Why a stream no longer exists: its last chunk was served, or it was evicted."""

    epoch: int
    chunk_seq: int
    reason: str  # "had its last chunk (chunk_seq 4)" / "was evicted (idle 612 s > 600 s)"


@dataclass(frozen=True)
class Admission:
    """A chunk that may run: against `previous` (None: a new stream) at `epoch` / `chunk_seq`."""

    previous: StreamState | None
    epoch: int
    chunk_seq: int


def admit(
    request_id: str,
    chunk: ChunkMeta,
    voice: VoiceRequest | None,
    previous: StreamState | None,
    ended: Ended | None,
) -> Admission:
    """Check `chunk` against the request's stream (see the module table); raise ChunkRejectedError if it may not run."""
    who = f"request {request_id}"
    if previous is not None:
        epoch = previous.epoch if chunk.epoch is None else chunk.epoch
        if epoch < previous.epoch:
            raise ChunkRejectedError(
                f"{who}: stale cache_epoch {epoch}; its stream is at epoch {previous.epoch} "
                f"(expected >= {previous.epoch})"
            )
        if epoch > previous.epoch:
            seq = 0 if chunk.chunk_seq is None else chunk.chunk_seq
            if seq != 0:
                raise ChunkRejectedError(f"{who}: a new cache_epoch {epoch} must start at chunk_seq 0, got {seq}")
            return Admission(None, epoch, 0)
        expected = previous.chunk_seq + 1
        seq = expected if chunk.chunk_seq is None else chunk.chunk_seq
        if seq != expected:
            what = "repeated" if seq < expected else "skipped"
            raise ChunkRejectedError(f"{who}: {what} chunk: expected chunk_seq {expected} (epoch {epoch}), got {seq}")
        if voice is not None and voice.key != previous.voice_key:
            raise ChunkRejectedError(
                f"{who}: voice changed mid-stream: the stream was set up with {previous.voice_key[:40]!r}, "
                f"this chunk asks for {voice.label} ({voice.key[:40]!r}); start a new cache_epoch for another voice"
            )
        return Admission(previous, epoch, seq)
    seq = 0 if chunk.chunk_seq is None else chunk.chunk_seq
    if ended is not None:
        epoch = ended.epoch if chunk.epoch is None else chunk.epoch
        if epoch < ended.epoch:
            raise ChunkRejectedError(f"{who}: stale cache_epoch {epoch}; its stream was at epoch {ended.epoch}")
        if epoch == ended.epoch:
            raise ChunkRejectedError(
                f"{who}: chunk_seq {seq} of epoch {epoch} arrived after its stream {ended.reason}; a new stream needs "
                f"cache_epoch {ended.epoch + 1} and chunk_seq 0"
            )
    else:
        epoch = 0 if chunk.epoch is None else chunk.epoch
    if seq != 0:
        raise ChunkRejectedError(
            f"{who}: the first chunk of a stream must have chunk_seq 0, got {seq} (no stream state for this request: "
            "never started, or already freed)"
        )
    return Admission(None, epoch, 0)


__all__ = ["Admission", "ChunkRejectedError", "Ended", "StreamState", "admit"]
