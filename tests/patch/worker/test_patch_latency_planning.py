# SPDX-License-Identifier: Apache-2.0
"""The latency-planning patch of `schedule`, on a stand-in scheduler (no engine).

The stand-in's `schedule` admits waiting requests while `len(running) < max_num_running_reqs`, as upstream's
fast path does; the tests check which requests one patched step runs for given published cost models (counts
worked out by hand from `cost_model.whole_rows_to_admit`'s rule), that stream requests and async-chunk schedulers
are never held back, that the off switch and a missing model leave upstream's policy, that the limit is restored
after the call, and that `check_upstream` refuses a `schedule` that no longer reads `max_num_running_reqs`. The
real upstream class is `tests/patch/test_real_upstream.py`'s. Two closed-loop simulations feed the estimator
steps timed by a known cost (CPU-like: a row costs a request alone; accelerator-like: rows almost free) and
check the step sizes the loop settles on: one at a time, and full batches.

Stream chunks that are due go first: the stage's published audio seconds are taken off a model-runner output by
the generation patch into the scheduler's `PlaybackClock` (a settable clock here); with more waiting streams than
free slots the one whose listener runs out first is admitted first, whole utterances keep their places, and
without pressure (or with the switch off, or a priority queue) the queue is untouched. A closed loop of three
streams in two slots shows a stream of short chunks stalling less than under queue order. The planner's counters
(`planner_stats.py`) are written next to the stage's stats file.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from vllm_omni_token2wav.model_executor.models.token2wav_stage.cost_model import COST_KEY, CostModel
from vllm_omni_token2wav.model_executor.models.token2wav_stage.playback import (
    PLAYBACK_KEY,
    PlaybackClock,
    step_audio_seconds,
)
from vllm_omni_token2wav.patch.checks import UpstreamMismatchError
from vllm_omni_token2wav.patch.worker import patch_generation_scheduler as generation
from vllm_omni_token2wav.patch.worker import patch_latency_planning as patch

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

CPU = CostModel(base_s=0.02, row_s=0.01, token_s=0.004, samples=10, solo_seen=True, batch_seen=True)
ACCEL = CostModel(base_s=0.20, row_s=0.002, token_s=0.00002, samples=10, solo_seen=True, batch_seen=True)


def _request(rid: str, tokens: int = 100, info: dict[str, Any] | None = None) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid, prompt_token_ids=list(range(tokens)), additional_information=info)


class _Scheduler:
    """Upstream's admission loop in miniature: waiting -> running while under `max_num_running_reqs`."""

    def __init__(self, max_num_seqs: int = 8, *, additional_config: Any = None, async_chunk: bool = False) -> None:
        self.max_num_running_reqs = max_num_seqs
        self.running: list[Any] = []
        self.waiting: deque[Any] = deque()
        self.vllm_config = SimpleNamespace(additional_config=additional_config)
        self._async = async_chunk

    def _async_chunk_transport_enabled(self) -> bool:
        return self._async

    def schedule(self, throttle_prefills: bool = False) -> list[str]:
        scheduled = []
        while self.waiting and len(self.running) < self.max_num_running_reqs:
            request = self.waiting.popleft()
            self.running.append(request)
            scheduled.append(request.request_id)
        return scheduled

    def finish_all(self) -> None:
        self.running.clear()


@pytest.fixture
def patched(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_Scheduler]]:
    monkeypatch.setattr(patch, "_scheduler_classes", lambda: (_Scheduler,))
    monkeypatch.setattr(patch, "_check_engine_helpers", lambda: None)  # the real one: test_real_upstream.py
    stock = _Scheduler.schedule
    patch.install()
    patch.install()  # idempotent
    assert _Scheduler.schedule.__wrapped__ is stock
    yield _Scheduler
    patch.uninstall()
    assert _Scheduler.schedule is stock


def _queue(s: _Scheduler, *requests: SimpleNamespace, model: CostModel | None) -> None:
    s.waiting.extend(requests)
    if model is not None:
        setattr(s, generation.COST_MODEL_ATTR, model)


def test_a_cpu_like_model_runs_whole_utterances_one_at_a_time_in_arrival_order(patched: type[_Scheduler]) -> None:
    s = patched()
    _queue(s, *(_request(f"r{i}") for i in range(4)), model=CPU)
    order = []
    while s.waiting:
        order.append(s.schedule())
        assert s.max_num_running_reqs == 8  # restored after every call
        s.finish_all()
    assert order == [["r0"], ["r1"], ["r2"], ["r3"]]


def test_an_accelerator_like_model_batches(patched: type[_Scheduler]) -> None:
    s = patched()
    _queue(s, *(_request(f"r{i}") for i in range(6)), model=ACCEL)
    assert s.schedule() == [f"r{i}" for i in range(6)]


def test_a_long_request_starts_its_own_step(patched: type[_Scheduler]) -> None:
    s = patched()
    _queue(s, _request("a"), _request("b"), _request("long", 20000), _request("c"), model=ACCEL)
    assert s.schedule() == ["a", "b"]


def test_no_model_schedules_as_upstream(patched: type[_Scheduler]) -> None:
    s = patched()
    _queue(s, *(_request(f"r{i}") for i in range(4)), model=None)
    assert s.schedule() == ["r0", "r1", "r2", "r3"]


def test_the_off_switch_schedules_as_upstream(patched: type[_Scheduler]) -> None:
    s = patched(additional_config={"token2wav_latency_planning": False})
    _queue(s, *(_request(f"r{i}") for i in range(4)), model=CPU)
    assert s.schedule() == ["r0", "r1", "r2", "r3"]


def test_stream_requests_are_never_held_back(patched: type[_Scheduler]) -> None:
    s = patched()
    chunk = {"meta": {"chunk_seq": 0, "left_context_size": 0}}
    _queue(s, _request("whole"), _request("stream", info=chunk), _request("whole2"), model=CPU)
    assert s.schedule() == ["whole", "stream", "whole2"]
    s.finish_all()
    s.running.append(_request("running-stream", info={"meta.chunk_seq": 3}))
    _queue(s, _request("w1"), _request("w2"), model=CPU)
    assert s.schedule() == ["w1", "w2"]


def test_an_async_chunk_scheduler_is_never_planned(patched: type[_Scheduler]) -> None:
    s = patched(async_chunk=True)
    _queue(s, *(_request(f"r{i}") for i in range(3)), model=CPU)
    assert s.schedule() == ["r0", "r1", "r2"]


def test_the_limit_counts_what_already_runs(patched: type[_Scheduler]) -> None:
    s = patched(max_num_seqs=4)
    s.running.append(_request("in-flight"))
    _queue(s, *(_request(f"r{i}") for i in range(3)), model=CPU)
    assert patch.planned_running_limit(s) == 2
    assert s.schedule() == ["r0"]


def test_the_limit_is_restored_when_the_stock_schedule_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken(_Scheduler):
        def schedule(self, throttle_prefills: bool = False) -> list[str]:
            seen.append(self.max_num_running_reqs)
            raise RuntimeError("stock failed")

    seen: list[int] = []
    monkeypatch.setattr(patch, "_scheduler_classes", lambda: (Broken,))
    monkeypatch.setattr(patch, "_check_engine_helpers", lambda: None)
    patch.install()
    try:
        s = Broken()
        _queue(s, *(_request(f"r{i}") for i in range(3)), model=CPU)
        with pytest.raises(RuntimeError, match="stock failed"):
            s.schedule()
        assert seen == [1] and s.max_num_running_reqs == 8
    finally:
        patch.uninstall()


def test_the_generation_patch_keeps_the_published_model_and_strips_it() -> None:
    first = {COST_KEY: CPU.encode(), "model_outputs": torch.zeros(3)}
    second = {COST_KEY: torch.empty(0, dtype=torch.float64), "model_outputs": torch.zeros(3)}
    output = SimpleNamespace(req_ids=["a", "b"], multimodal_outputs=[first, second])
    assert generation.take_cost_model(output) == CPU
    assert COST_KEY not in first and COST_KEY not in second
    assert generation.take_cost_model(SimpleNamespace(req_ids=["a"], multimodal_outputs=[{}])) is None


def test_a_schedule_that_no_longer_reads_the_limit_is_refused() -> None:
    class Renamed(_Scheduler):
        def schedule(self, throttle_prefills: bool = False) -> list[str]:
            return []

    patch.check_upstream(_Scheduler, "fake.Scheduler")
    with pytest.raises(UpstreamMismatchError, match="max_num_running_reqs"):
        patch.check_upstream(Renamed, "fake.Renamed")

    class NoFlag(_Scheduler):
        _async_chunk_transport_enabled = None  # type: ignore[assignment]

    with pytest.raises(UpstreamMismatchError, match="_async_chunk_transport_enabled"):
        patch.check_upstream(NoFlag, "fake.NoFlag")


def _simulate(patched: type[_Scheduler], step_seconds: Any, steps: int = 12) -> list[int]:
    """A closed loop of 4 equal requests through the patched stand-in and a stage whose steps cost `step_seconds`."""
    from vllm_omni_token2wav.model_executor.models.token2wav_stage.cost_model import CostEstimator

    s, est, sizes = patched(), CostEstimator(), []
    s.waiting.extend(_request(f"r{i}", 50) for i in range(4))
    for step in range(steps):
        ran = s.schedule()
        sizes.append(len(ran))
        est.record(len(ran), 50 * len(ran), step_seconds(len(ran)))
        if (model := est.model()) is not None:
            setattr(s, generation.COST_MODEL_ATTR, model)
        s.finish_all()
        s.waiting.extend(_request(f"r{step}-{i}", 50) for i in range(len(ran)))  # each finished one comes back
    return sizes


def test_measured_cpu_like_steps_lead_to_one_at_a_time(patched: type[_Scheduler]) -> None:
    # a row costs nearly a request alone: 0.05 s per step + 1.5 s per row (whole utterances: one per launch)
    sizes = _simulate(patched, lambda rows: 0.05 + 1.5 * rows)
    assert sizes[:3] == [4, 4, 1]  # upstream's policy until two steps are measured (batched), then a solo probe
    assert sizes[3:] == [1] * 9


def test_measured_accelerator_like_steps_keep_batching(patched: type[_Scheduler]) -> None:
    sizes = _simulate(patched, lambda rows: 1.0 + 0.02 * rows)  # launch-bound: rows almost free
    assert sizes[:3] == [4, 4, 1]
    assert sizes[3:] == [4] * 9


# --- stream chunks that are due go first -----------------------------------------------------------------------


class _Time:
    """A settable clock for `PlaybackClock` (monotonic and wall clock in step)."""

    def __init__(self) -> None:
        self.t = 100.0

    def now(self) -> float:
        return self.t

    def wall(self) -> float:
        return 1_000_000.0 + self.t


def _stream(rid: str, seq: int = 1, *, arrival: float | None = None) -> SimpleNamespace:
    request = _request(rid, 25, info={"meta": {"chunk_seq": seq}})
    request.num_computed_tokens = 0
    request.arrival_time = arrival
    return request


def _served(s: _Scheduler, clock: Any, rid_seconds: dict[str, float]) -> None:
    """One step's output as our stage publishes it, taken off by the generation patch into the scheduler's clock."""
    payloads = [
        {PLAYBACK_KEY: t, "model_outputs": torch.zeros(1)}
        for t in step_audio_seconds([round(sec * 24000) for sec in rid_seconds.values()], 24000)
    ]
    output = SimpleNamespace(req_ids=list(rid_seconds), multimodal_outputs=payloads)
    if getattr(s, generation.PLAYBACK_ATTR, None) is None:
        setattr(s, generation.PLAYBACK_ATTR, clock)
    generation._record_playback(s, generation.take_playback(output))
    assert all(PLAYBACK_KEY not in p for p in payloads)  # never reaches the orchestrator


def test_a_due_stream_chunk_overtakes_one_with_audio_left(patched: type[_Scheduler]) -> None:
    time_ = _Time()
    clock = PlaybackClock(now=time_.now, wall=time_.wall)
    s = patched(max_num_seqs=2)
    _served(s, clock, {"full": 3.0, "dry": 0.5, "low": 1.0})  # first audio of all three at t = 100
    time_.t += 0.8  # "dry" ran out 0.3 s ago, "low" runs out in 0.2 s, "full" in 2.2 s
    s.waiting.extend([_stream("full"), _stream("dry"), _stream("low")])
    assert s.schedule() == ["dry", "low"]
    assert [r.request_id for r in s.waiting] == ["full"]


def test_without_pressure_the_queue_is_not_touched(patched: type[_Scheduler]) -> None:
    time_ = _Time()
    clock = PlaybackClock(now=time_.now, wall=time_.wall)
    s = patched(max_num_seqs=3)
    _served(s, clock, {"full": 3.0, "dry": 0.5, "low": 1.0})
    time_.t += 0.8
    s.waiting.extend([_stream("full"), _stream("dry"), _stream("low")])
    assert patch.order_due_streams(s) == 0
    assert s.schedule() == ["full", "dry", "low"]  # every waiting stream fits the step: queue order


def test_a_token_budget_too_small_for_the_waiting_chunks_is_pressure_too(patched: type[_Scheduler]) -> None:
    time_ = _Time()
    s = patched(max_num_seqs=8)
    _served(s, PlaybackClock(now=time_.now, wall=time_.wall), {"full": 3.0, "dry": 0.1})
    s.waiting.extend([_stream("full"), _stream("dry")])  # 25 ready tokens each
    s.max_num_scheduled_tokens = 50
    assert patch.order_due_streams(s) == 0  # both fit the budget
    s.max_num_scheduled_tokens = 40
    assert patch.order_due_streams(s) == 1
    assert [r.request_id for r in s.waiting] == ["dry", "full"]


def test_whole_utterances_keep_their_places_and_a_new_stream_is_due_since_it_arrived(
    patched: type[_Scheduler],
) -> None:
    time_ = _Time()
    clock = PlaybackClock(now=time_.now, wall=time_.wall)
    s = patched(max_num_seqs=2)
    _served(s, clock, {"old": 2.0})
    time_.t += 0.5  # "old" has 1.5 s left; "new" arrived 0.2 s ago without audio: its listener waits now
    s.waiting.extend(
        [_request("whole"), _stream("old"), _request("whole2"), _stream("new", 0, arrival=time_.wall() - 0.2)]
    )
    assert patch.order_due_streams(s) == 1
    assert [r.request_id for r in s.waiting] == ["whole", "new", "whole2", "old"]
    assert s.schedule() == ["whole", "new"]


def test_due_order_is_off_with_the_switch_and_for_the_priority_policy(patched: type[_Scheduler]) -> None:
    time_ = _Time()
    for s in (
        patched(max_num_seqs=1, additional_config={"token2wav_latency_planning": False}),
        patched(max_num_seqs=1),
    ):
        _served(s, PlaybackClock(now=time_.now, wall=time_.wall), {"full": 3.0, "dry": 0.1})
        s.waiting.extend([_stream("full"), _stream("dry")])
        if s.vllm_config.additional_config is None:
            s.waiting = _ListQueue(s.waiting)  # not a deque: vLLM's PriorityRequestQueue keeps its own order
        assert s.schedule() == ["full"]


class _ListQueue(list):
    def popleft(self) -> Any:
        return self.pop(0)


def test_the_clock_forgets_finished_requests_and_counts_only_audio() -> None:
    time_ = _Time()
    clock = PlaybackClock(now=time_.now, wall=time_.wall)
    clock.served("a", 0.0)  # a step without audio does not start the listener's clock
    assert len(clock) == 0 and clock.due("a", None) == time_.t
    clock.served("a", 1.0)
    time_.t += 5
    clock.served("a", 0.5)
    assert clock.due("a", None) == 100.0 + 1.5 and clock.audio_s("a") == 1.5
    clock.forget_except(["b"])
    assert len(clock) == 0


def _simulate_streams(patched: type[_Scheduler], due_first: bool, steps: int = 40) -> dict[str, float]:
    """A closed loop: 3 streams, 2 slots, 0.5 s steps; "short" chunks carry 0.6 s of audio, the others 2 s.

    Each step runs what `schedule` admits, publishes its audio through the generation patch into the clock and
    puts the streams back at the waiting tail (as vLLM-Omni re-queues a stream after each chunk). Returns each
    listener's stall seconds (time with an empty buffer after its first audio).
    """
    time_ = _Time()
    s = patched(max_num_seqs=2, additional_config={"token2wav_latency_planning": due_first})
    clock = PlaybackClock(now=time_.now, wall=time_.wall)
    setattr(s, generation.PLAYBACK_ATTR, clock)
    chunk_s = {"short": 0.6, "long1": 2.0, "long2": 2.0}
    s.waiting.extend(_stream(rid, arrival=time_.wall()) for rid in chunk_s)
    playback_end: dict[str, float] = {}
    stall = dict.fromkeys(chunk_s, 0.0)
    for _ in range(steps):
        ran = s.schedule()
        time_.t += 0.5
        _served(s, clock, {rid: chunk_s[rid] for rid in ran})
        for rid in ran:
            end = playback_end.get(rid, time_.t)
            if time_.t > end:
                stall[rid] += time_.t - end
                end = time_.t
            playback_end[rid] = end + chunk_s[rid]
        s.finish_all()
        s.waiting.extend(_stream(rid) for rid in ran)
    return stall


def test_due_order_keeps_a_stream_with_short_chunks_playing(patched: type[_Scheduler]) -> None:
    fifo = _simulate_streams(patched, due_first=False)
    due = _simulate_streams(patched, due_first=True)
    assert fifo["long1"] == fifo["long2"] == due["long1"] == due["long2"] == 0.0  # 2 s chunks never run dry
    assert fifo["short"] > 1.0  # queue order: one chunk per 0.75 s on average for 0.6 s of audio, it stalls
    assert due["short"] == 0.0  # due first: a chunk every step (0.5 s) for 0.6 s of audio, it never runs dry


# --- the planner's counters ------------------------------------------------------------------------------------


def test_the_planner_counts_its_decisions_next_to_the_stage_stats(
    patched: type[_Scheduler], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from vllm_omni_token2wav.model_executor.models.token2wav_stage.planner_stats import planner_stats_path

    stats_path = tmp_path / "stage.json"
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_STAGE_STATS", str(stats_path))
    s = patched()
    _queue(s, *(_request(f"r{i}") for i in range(3)), model=CPU)
    while s.waiting:
        s.schedule()
        s.finish_all()
    written = json.loads(open(planner_stats_path(str(stats_path))).read())
    assert written["enabled"] is True
    assert (written["planned_steps"], written["held_back_steps"], written["held_back_requests"]) == (2, 2, 3)
    assert written["admitted"] == {"1/3": 1, "1/2": 1}  # the last request waited alone: nothing to plan
    assert written["model"]["row_s"] == CPU.row_s

    off = patched(additional_config={"token2wav_latency_planning": False})
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_STAGE_STATS", str(tmp_path / "off.json"))
    _queue(off, *(_request(f"r{i}") for i in range(3)), model=CPU)
    assert off.schedule() == ["r0", "r1", "r2"]
    written = json.loads(open(planner_stats_path(str(tmp_path / "off.json"))).read())
    assert written["enabled"] is False and written["planned_steps"] == written["held_back_requests"] == 0


def test_no_stats_variable_no_counters(patched: type[_Scheduler], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_OMNI_TOKEN2WAV_STAGE_STATS", raising=False)
    s = patched()
    _queue(s, *(_request(f"r{i}") for i in range(3)), model=CPU)
    s.schedule()
    assert patch.planner_stats(s).stats is None
