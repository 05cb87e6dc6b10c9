# SPDX-License-Identifier: Apache-2.0
"""Per-request streaming state of the Token2Wav stage, and the vocoder-side streaming rules.

Upstream keeps one stream's caches (`stream_cache`, `hift_cache_dict`) on the model object, so
two concurrent requests overwrite each other's state. Here every stream is a `Token2WavStream`
object the caller holds; its caches are one immutable `StreamCaches` value
(`synthesis.py`) that the facade's `stream()` replaces only after a chunk has been computed
completely, so a failing chunk leaves the request resumable and can never touch another request.
The serving stage (`token2wav_stage/`) keeps the same `StreamCaches` per request id and runs the
chunks of many requests through the same batched kernels.

One stream is one request: its chunks must run one at a time, in its caller's order. Two threads
feeding one stream object would interleave their chunks; a blocking lock only serialises that
interleaving, so every call gets audio computed from another call's state: silently wrong audio.
`StepGuard` therefore takes the stream's lock without waiting and raises `StreamInUseError`
(naming the fix: one stream per concurrent caller, passed as `state=`) when a chunk of the stream
is already running. A stream may still move between threads between chunks (a worker pool).

The streaming geometry is the reference's (Step-Audio2 `token2wav.py`, MiniCPM-o code2wav; the vocoder's
part and the cross-fade live beside HiFT, `layers/hift/crossfade.py`, the lookahead beside the flow):

| constant                 | value | meaning                                                             |
|--------------------------|-------|---------------------------------------------------------------------|
| `CHUNK_TOKENS`           | 25    | tokens emitted per chunk (50 mel frames, 1 s of audio)              |
| `PRE_LOOKAHEAD_TOKENS`   | 3     | tokens of the next chunk fed as lookahead with a non-final chunk    |
| `MEL_CACHE_FRAMES`       | 8     | mel frames re-vocoded at the start of the next chunk                |
| `SOURCE_CACHE_SAMPLES`   | 3840  | = 8 x 480: NSF source samples carried over (phase continuity)      |
| cross-fade               | 3840  | first 3840 samples of a chunk blended with the previous tail        |

Cross-fade: `w = hamming(2 * 3840)` (float64, symmetric, `np.hamming`); the first 3840 samples
of a chunk become `new[:3840] * w[:3840] + tail * w[3840:]` where `tail` is the previous call's
last 3840 samples, which that call held back. Every non-final chunk emits all but its last 3840
samples, the final chunk emits everything, so a stream of chunks with mel lengths `m_i` emits
exactly `480 * sum(m_i)` samples: the same length as the whole-utterance path.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from vllm_omni_token2wav.model_executor.layers.flow.streaming import PRE_LOOKAHEAD_TOKENS
from vllm_omni_token2wav.model_executor.layers.hift.crossfade import (
    MEL_CACHE_FRAMES,
    SAMPLES_PER_FRAME,
    SOURCE_CACHE_SAMPLES,
    crossfade,
    crossfade_rows,
    crossfade_window,
)
from vllm_omni_token2wav.model_executor.models.token2wav_core.prompt_features import PromptFeatures

if TYPE_CHECKING:
    from vllm_omni_token2wav.model_executor.layers.flow.batched import FlowRowState
    from vllm_omni_token2wav.model_executor.models.token2wav_core.synthesis import StreamCaches

CHUNK_TOKENS = 25
OUTPUT_SAMPLE_RATE = 24_000


class StreamInUseError(RuntimeError):
    """A stream was used concurrently: a chunk while another chunk of it runs, or a facade's default
    stream from a thread other than the one that set it up. The message names the fix (`state=`)."""


#: The fix every `StreamInUseError` names.
OWN_STREAM_ADVICE = (
    "each concurrent caller needs its own stream from set_stream_cache(prompt_wav), passed as state=... "
    "to every stream() call of its request"
)


class StepGuard:
    """Runs one chunk of a stream at a time and refuses (never queues) a concurrent one (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: str | None = None  # name of the thread running a chunk (for the message)

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        """Hold the stream for one chunk; raise `StreamInUseError` at once if another chunk of it is running."""
        if not self._lock.acquire(blocking=False):
            holder = self._holder
            raise StreamInUseError(
                f"{what}: this stream is already running a chunk"
                f"{f' in thread {holder!r}' if holder else ''}, and thread {threading.current_thread().name!r} "
                "called it concurrently: a stream is one request's state and takes its chunks one at a time, in "
                f"order, so the two calls would get each other's audio; {OWN_STREAM_ADVICE}"
            )
        self._holder = threading.current_thread().name
        try:
            yield
        finally:
            self._holder = None
            self._lock.release()


@dataclass
class Token2WavStream:
    """One streaming request of the facade; create it with `set_stream_cache(prompt_wav)`.

    `caches` is replaced (never modified) after each successful chunk. `guard` lets one chunk of this
    request run at a time and refuses a concurrent one (`StreamInUseError`); different requests share
    nothing mutable (the post-prompt flow cache they start from is shared and read-only).
    """

    features: PromptFeatures
    caches: StreamCaches
    #: The `prompt_wav` argument of `set_stream_cache` (upstream callers pass it again with every chunk).
    prompt_ref: object = None
    chunks_done: int = 0
    samples_emitted: int = 0
    finished: bool = False
    guard: StepGuard = field(default_factory=StepGuard, repr=False, compare=False)

    @classmethod
    def start(cls, features: PromptFeatures, caches: StreamCaches, prompt_ref: object) -> Token2WavStream:
        return cls(features=features, caches=caches, prompt_ref=prompt_ref)

    @property
    def flow_cache(self) -> FlowRowState:
        """The flow part of the caches (the shared post-prompt state until the first chunk)."""
        return self.caches.flow


def stream_chunks(
    tokens: Sequence[int] | torch.Tensor | np.ndarray,
    chunk_tokens: int = CHUNK_TOKENS,
    lookahead: int = PRE_LOOKAHEAD_TOKENS,
) -> Iterator[tuple[list[int], bool]]:
    """The reference's chunking of a token sequence: `(chunk, last_chunk)` pairs for `stream()`.

    A non-final chunk is `chunk_tokens + lookahead` tokens, after which the buffer advances by
    `chunk_tokens` (the lookahead tokens open the next chunk); the rest (>= 1 token) is the final
    chunk. This is how a caller feeds tokens as an LLM produces them.
    """
    if chunk_tokens < 2 or lookahead < 0:
        raise ValueError(f"chunk_tokens must be >= 2 and lookahead >= 0, got {chunk_tokens} / {lookahead}")
    ids = [int(t) for t in (tokens.reshape(-1).tolist() if isinstance(tokens, torch.Tensor | np.ndarray) else tokens)]
    if not ids:
        raise ValueError("no speech tokens to stream")
    start = 0
    # `>=` as the reference's feeding loop; the second test keeps the final chunk non-empty (lookahead 0).
    while len(ids) - start >= chunk_tokens + lookahead and len(ids) - start > chunk_tokens:
        yield ids[start : start + chunk_tokens + lookahead], False
        start += chunk_tokens
    yield ids[start:], True


def waveform_to_pcm16(speech: torch.Tensor) -> bytes:
    """Float waveform -> 16-bit little-endian PCM bytes (clipped to [-1, 1], scaled by 32767, as the reference)."""
    array = np.clip(speech.detach().float().cpu().numpy().reshape(-1), -1.0, 1.0)
    return (array * 32767.0).astype("<i2").tobytes()


__all__ = [
    "CHUNK_TOKENS",
    "MEL_CACHE_FRAMES",
    "OUTPUT_SAMPLE_RATE",
    "OWN_STREAM_ADVICE",
    "PRE_LOOKAHEAD_TOKENS",
    "SAMPLES_PER_FRAME",
    "SOURCE_CACHE_SAMPLES",
    "StepGuard",
    "StreamInUseError",
    "Token2WavStream",
    "crossfade",
    "crossfade_rows",
    "crossfade_window",
    "stream_chunks",
    "waveform_to_pcm16",
]
