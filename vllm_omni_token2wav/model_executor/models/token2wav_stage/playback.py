# SPDX-License-Identifier: Apache-2.0
"""Which stream chunk is due first: the client's playback clock per stream, kept by the scheduler (issue 32).

Why: when more streams have a chunk ready than one step can take (`max_num_seqs`, the token budget), vLLM-Omni
admits them in queue order, so a stream whose listener has already played everything it was sent can wait
behind one that still holds seconds of audio. The listener's buffer runs out at

    due = (when its first audio left the stage) + (seconds of audio it has been sent)

and a stream that has sent nothing yet is due since it arrived (its listener waits for the first packet). Running
the ready chunks in order of `due` (earliest deadline first) serves the stream that is about to stall first.

- Stage side: every step's output carries, under `PLAYBACK_KEY`, the seconds of audio each stream-chunk segment
  produced in that step (`step_audio_seconds`: a 1-element float64 tensor; an empty one for every other segment).
  Only our stage publishes it, and only with latency planning on (`cost_model.latency_planning_enabled`).
- Scheduler side: the engine-core patch `patch/worker/patch_generation_scheduler.py` takes it off the model
  runner's output (it never reaches the orchestrator) into the scheduler's `PlaybackClock` (`served`), which
  stamps a stream's first audio with the scheduler's clock; `patch/worker/patch_latency_planning.py` orders the
  waiting stream chunks by `PlaybackClock.due` before the stock `schedule` admits them (`due_order`).

The clock is the engine core's monotonic clock at the step that produced the audio: the transport to the client
adds about the same delay to every stream, so the order holds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import torch

__all__ = ["PLAYBACK_KEY", "PlaybackClock", "decode_seconds", "due_order", "step_audio_seconds"]

#: The `multimodal_outputs` key of each segment's new audio seconds (taken off by the engine-core patch).
PLAYBACK_KEY: Final = "token2wav_audio_s"


def step_audio_seconds(samples: Sequence[int | None], sample_rate: int) -> list[torch.Tensor]:
    """Per segment: its new audio in seconds as a 1-element float64 tensor, or an empty one (`None`: not a chunk)."""
    empty = torch.empty(0, dtype=torch.float64)
    return [empty if n is None else torch.tensor([n / sample_rate], dtype=torch.float64) for n in samples]


def decode_seconds(t: Any) -> float | None:
    """The seconds `step_audio_seconds` wrote, or None (empty / malformed / negative or non-finite)."""
    if not isinstance(t, torch.Tensor) or t.numel() != 1:
        return None
    value = float(t.detach().to("cpu", torch.float64).reshape(-1)[0])
    return value if math.isfinite(value) and value >= 0 else None


@dataclass
class _Stream:
    first_audio_at: float
    audio_s: float


@dataclass
class PlaybackClock:
    """Per request id: when its first audio left the stage and how many seconds it has been sent."""

    now: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time  # vLLM's `Request.arrival_time` clock
    _streams: dict[str, _Stream] = field(default_factory=dict)

    def served(self, request_id: str, seconds: float) -> None:
        """`seconds` of new audio of `request_id` left the stage in the step that just ended."""
        stream = self._streams.get(request_id)
        if stream is None:
            if seconds <= 0:
                return
            self._streams[request_id] = _Stream(self.now(), seconds)
        else:
            stream.audio_s += seconds

    def due(self, request_id: str, arrival_time: float | None) -> float:
        """When the request's listener runs out of audio (the `now` clock); since arrival if it got none yet."""
        stream = self._streams.get(request_id)
        if stream is not None:
            return stream.first_audio_at + stream.audio_s
        if arrival_time is None:
            return self.now()
        return self.now() - max(0.0, self.wall() - float(arrival_time))

    def audio_s(self, request_id: str) -> float:
        stream = self._streams.get(request_id)
        return 0.0 if stream is None else stream.audio_s

    def forget_except(self, live: Iterable[str]) -> None:
        """Drop the streams of requests that are no longer live (finished, aborted)."""
        keep = set(live)
        for rid in [r for r in self._streams if r not in keep]:
            del self._streams[rid]

    def __len__(self) -> int:
        return len(self._streams)


def due_order(requests: Sequence[Any], is_stream: Sequence[bool], clock: PlaybackClock) -> list[Any]:
    """`requests` with the stream chunks' places refilled in order of `clock.due` (stable); others stay put."""
    slots = [i for i, s in enumerate(is_stream) if s]
    streams = [requests[i] for i in slots]
    ranked = sorted(
        streams, key=lambda r: clock.due(str(r.request_id), getattr(r, "arrival_time", None))
    )  # sorted() is stable: equal deadlines keep queue order
    out = list(requests)
    for i, request in zip(slots, ranked, strict=True):
        out[i] = request
    return out
