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
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from vllm_omni_token2wav.model_executor.models.token2wav_stage.cost_model import COST_KEY, CostModel
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
