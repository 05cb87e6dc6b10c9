# SPDX-License-Identifier: Apache-2.0
"""A small thread-safe LRU that computes each key once, for per-voice prompt features.

Serving traffic reuses a handful of reference voices, and a prompt costs a fbank, a CAM++ forward
and a mel (tens of ms on the host for the CPU path). Request threads of one stage share the cache:
concurrent misses on the same key wait for the first computation instead of repeating it, and a
failed computation is not cached (every waiter sees the same exception; the next call retries).

Values are copied on the way in and out through the `copy` function (for `PromptFeatures`, its
`clone()`), so no caller ever holds storage that another caller or the cache can see.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Generic, TypeVar

V = TypeVar("V")


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    size: int
    max_entries: int


class ContentLruCache(Generic[V]):
    """LRU of at most `max_entries` values; `max_entries=0` disables storing (still no duplicate work)."""

    def __init__(self, max_entries: int, copy: Callable[[V], V]) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 0:
            raise ValueError(f"cache size must be an int >= 0, got {max_entries!r}")
        self.max_entries = max_entries
        self._copy = copy
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, V] = OrderedDict()
        self._inflight: dict[Hashable, Future[V]] = {}
        self._hits = 0
        self._misses = 0

    def get_or_compute(self, key: Hashable, compute: Callable[[], V]) -> V:
        """A private copy of the value for `key`, calling `compute()` only if no one has (or is)."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self._hits += 1
                value = self._entries[key]
                owner = False
                future: Future[V] | None = None
            elif key in self._inflight:
                self._hits += 1
                future = self._inflight[key]
                owner = False
            else:
                self._misses += 1
                future = Future()
                self._inflight[key] = future
                owner = True
        if future is None:
            return self._copy(value)
        if not owner:
            return self._copy(future.result())

        try:
            result = compute()
        except BaseException as exc:
            with self._lock:
                del self._inflight[key]
            future.set_exception(exc)
            raise
        stored = self._copy(result)
        with self._lock:
            del self._inflight[key]
            if self.max_entries > 0:
                self._entries[key] = stored
                self._entries.move_to_end(key)
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
        future.set_result(stored)
        return result

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, len(self._entries), self.max_entries)
