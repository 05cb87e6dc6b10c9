# SPDX-License-Identifier: Apache-2.0
"""Where the stage keeps its streams: one `StreamState` per request key, bounded in count and age.

A stream's memory is dominated by its flow caches (hundreds of MB at full size, see
docs/design/token2wav_stage.md), so the store never keeps one longer than needed:

- a stream is removed when its last chunk has been served, and by `forget()` (the runner's
  `on_requests_finished`), which also drops what the store remembers about it;
- a stream not touched for `idle_timeout_s` (its request vanished without a last chunk or a
  finish notice) is evicted, with a warning naming it;
- when more than `max_streams` are live (a bound only direct users set: the stage model sets none and limits
  admission instead, `step_executor.py`), the least recently used are evicted, with a warning.

An ended stream leaves a small `Ended` record (epoch, last chunk_seq, why) so a late chunk of it
gets a clear error instead of silently starting a new stream; at most `max_ended` are kept (LRU).
The store is only mutated between steps (the engine commits a step's results at its end) and is
guarded by a lock, since `on_requests_finished` may come from another thread than `forward`.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.models.token2wav_stage.state import Ended, StreamState

logger = init_logger(__name__)

DEFAULT_IDLE_TIMEOUT_S = 600.0
DEFAULT_MAX_ENDED = 4096


@dataclass(frozen=True)
class Eviction:
    key: str
    request_id: str
    reason: str


class StreamStore:
    """Live streams by key (LRU order), with idle-timeout and (optional) count-bound eviction."""

    def __init__(
        self,
        *,
        max_streams: int | None,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        max_ended: int = DEFAULT_MAX_ENDED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_streams is not None and max_streams < 1:
            raise ValueError(f"max_streams must be >= 1 or None, got {max_streams}")
        if not idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {idle_timeout_s}")
        self.max_streams = int(max_streams) if max_streams is not None else None
        self.idle_timeout_s = float(idle_timeout_s)
        self.max_ended = int(max_ended)
        self._clock = clock
        self._lock = threading.Lock()
        self._live: OrderedDict[str, tuple[StreamState, float]] = OrderedDict()
        self._ended: OrderedDict[str, Ended] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._live)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._live

    def get(self, key: str) -> StreamState | None:
        with self._lock:
            entry = self._live.get(key)
            return entry[0] if entry is not None else None

    def ended(self, key: str) -> Ended | None:
        with self._lock:
            return self._ended.get(key)

    def states(self) -> list[StreamState]:
        with self._lock:
            return [state for state, _ in self._live.values()]

    def commit(self, put: Iterable[StreamState], end: Iterable[tuple[str, Ended]]) -> list[Eviction]:
        """Store a step's new states and ended streams; then enforce the count bound (returns evictions)."""
        now = self._clock()
        with self._lock:
            for key, record in end:
                self._live.pop(key, None)
                self._remember(key, record)
            for state in put:
                self._ended.pop(state.key, None)
                self._live[state.key] = (state, now)
                self._live.move_to_end(state.key)
            evicted = []
            while self.max_streams is not None and len(self._live) > self.max_streams:
                key, (state, _) = next(iter(self._live.items()))
                evicted.append(self._evict(key, state, f"was evicted (more than {self.max_streams} live streams)"))
        self._warn(evicted)
        return evicted

    def sweep(self) -> list[Eviction]:
        """Evict streams idle for longer than the timeout (the stage model calls it on every `forward`)."""
        now = self._clock()
        with self._lock:
            stale = [
                (key, state, now - touched)
                for key, (state, touched) in self._live.items()
                if now - touched > self.idle_timeout_s
            ]
            evicted = [
                self._evict(key, state, f"was evicted (idle {idle:.0f} s > {self.idle_timeout_s:.0f} s)")
                for key, state, idle in stale
            ]
        self._warn(evicted)
        return evicted

    def forget(self, keys: Iterable[str]) -> int:
        """Drop the streams and ended records of `keys` (finished requests); returns how many streams were live."""
        dropped = 0
        with self._lock:
            for key in keys:
                dropped += self._live.pop(key, None) is not None
                self._ended.pop(key, None)
        return dropped

    def drop(self, key: str, reason: str) -> bool:
        """End the live stream `key` now (the memory budget refused its growth), remembering `reason` so that
        its later chunks are rejected naming it; whether it was live."""
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                return False
            self._evict(key, entry[0], reason)
        return True

    def _evict(self, key: str, state: StreamState, reason: str) -> Eviction:
        self._live.pop(key, None)
        self._remember(key, Ended(state.epoch, state.chunk_seq, reason))
        return Eviction(key, state.request_id, reason)

    def _remember(self, key: str, record: Ended) -> None:
        self._ended[key] = record
        self._ended.move_to_end(key)
        while len(self._ended) > self.max_ended:
            self._ended.popitem(last=False)

    @staticmethod
    def _warn(evicted: list[Eviction]) -> None:
        for e in evicted:
            logger.warning("token2wav stage: stream of request %s %s; its caches are freed", e.request_id, e.reason)


__all__ = ["DEFAULT_IDLE_TIMEOUT_S", "DEFAULT_MAX_ENDED", "Eviction", "StreamStore"]
