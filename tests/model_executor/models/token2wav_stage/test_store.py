# SPDX-License-Identifier: Apache-2.0
"""The stream store: commit, finish, idle-timeout and count-bound eviction, ended-stream records."""

from __future__ import annotations

import logging

import pytest

from vllm_omni_token2wav.model_executor.models.token2wav_stage.state import Ended, StreamState
from vllm_omni_token2wav.model_executor.models.token2wav_stage.store import StreamStore

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _state(key: str, seq: int = 0) -> StreamState:
    return StreamState(key, f"req-{key}", 0, seq, "default", voice=None, caches=None)


def test_commit_replaces_states_and_ends_streams() -> None:
    store = StreamStore(max_streams=4, clock=Clock())
    store.commit([_state("a"), _state("b")], [])
    assert len(store) == 2 and store.get("a") == _state("a")
    store.commit([_state("a", 1)], [("b", Ended(0, 0, "had its last chunk (chunk_seq 0)"))])
    assert store.get("a") == _state("a", 1) and store.get("b") is None and len(store) == 1
    assert store.ended("b") == Ended(0, 0, "had its last chunk (chunk_seq 0)")
    store.commit([_state("b")], [])  # a new stream of the same key clears the record
    assert store.ended("b") is None and len(store) == 2


def test_forget_frees_streams_and_records_of_finished_requests() -> None:
    store = StreamStore(max_streams=4, clock=Clock())
    store.commit([_state("a"), _state("b")], [("c", Ended(0, 2, "x"))])
    assert store.forget(["a", "c", "zzz"]) == 1
    assert store.get("a") is None and store.ended("c") is None and len(store) == 1


def test_idle_streams_are_evicted_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    store = StreamStore(max_streams=4, idle_timeout_s=60.0, clock=clock)
    store.commit([_state("a")], [])
    clock.now += 30
    store.commit([_state("b")], [])
    clock.now += 31
    with caplog.at_level(logging.WARNING):
        evicted = store.sweep()
    assert [e.key for e in evicted] == ["a"] and len(store) == 1
    assert store.ended("a") == Ended(0, 0, "was evicted (idle 61 s > 60 s)")
    assert "stream of request req-a was evicted (idle 61 s > 60 s)" in caplog.text


def test_the_least_recently_used_streams_go_beyond_the_bound(caplog: pytest.LogCaptureFixture) -> None:
    store = StreamStore(max_streams=2, clock=Clock())
    store.commit([_state("a"), _state("b")], [])
    store.commit([_state("a", 1)], [])  # a is now more recent than b
    with caplog.at_level(logging.WARNING):
        evicted = store.commit([_state("c")], [])
    assert [e.key for e in evicted] == ["b"] and sorted(s.key for s in store.states()) == ["a", "c"]
    assert "more than 2 live streams" in caplog.text and store.ended("b") is not None


def test_ended_records_are_bounded() -> None:
    store = StreamStore(max_streams=2, max_ended=3, clock=Clock())
    store.commit([], [(k, Ended(0, 0, "x")) for k in "abcde"])
    assert [store.ended(k) is not None for k in "abcde"] == [False, False, True, True, True]


def test_bad_bounds_are_rejected() -> None:
    with pytest.raises(ValueError, match="max_streams must be >= 1"):
        StreamStore(max_streams=0)
    with pytest.raises(ValueError, match="idle_timeout_s must be > 0"):
        StreamStore(max_streams=1, idle_timeout_s=0)
