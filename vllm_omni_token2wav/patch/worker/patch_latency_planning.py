# SPDX-License-Identifier: Apache-2.0
"""Latency-aware planning of whole utterances: how many the generation scheduler runs in one step (issue 32).

Register row: `worker.patch_latency_planning` (patches
`vllm_omni.core.sched.omni_generation_scheduler.OmniGenerationScheduler.schedule`).

vLLM-Omni 0.30 finishes a whole (non-streamed) generation request after the step that scheduled its prompt, and
its `schedule` admits waiting requests until `max_num_running_reqs` (the deployment's `max_num_seqs`) or the token
budget runs out. With our stage's `max_num_seqs: 8` on a CPU, eight requests then all finish at the end of one
step that costs nearly eight solo steps: the median request waits twice as long as upstream's one at a time.
Only the scheduler can decide this (a request the stage skipped would finish with no audio), so this patch
wraps `schedule`:

1. it plans only where our stage published a cost model (`patch_generation_scheduler.COST_MODEL_ATTR`, taken
   off the model runner's output; upstream's own code2wav classes publish none, so they keep upstream's policy),
   where the stage's `additional_config` does not say `token2wav_latency_planning: false`, where the scheduler
   moves no async chunks (`_async_chunk_transport_enabled()` is false) and where no running or waiting request
   carries stream meta (`cost_model.carries_stream_meta`): stream chunks are never held back;
2. it reads the waiting requests in queue order (arrival order under FCFS) and asks
   `cost_model.whole_rows_to_admit` how many of them one step should run (their prompt lengths are their codec
   ids);
3. it lowers `max_num_running_reqs` for this one call to the running requests plus that count, calls the stock
   `schedule` (whose fast path and fallback both stop admitting there) and restores it.

Stream chunks that are due go first (`order_due_streams`, before the rule above): where our stage published its
streams' audio (`patch_generation_scheduler.PLAYBACK_ATTR`, a `token2wav_stage/playback.PlaybackClock`), planning
is on, the waiting queue is FCFS (a `deque`; under the priority policy the client's priorities rule), two or more
stream requests wait, and more requests wait than the step has free slots (`max_num_running_reqs` minus the
running requests) or their ready tokens exceed the token budget, the stream requests' places in the waiting
queue are refilled in order of `PlaybackClock.due` (the moment the listener's audio runs out; arrival for a
stream without audio yet), stably; whole utterances keep their places. Without that pressure the queue is not
touched. The count is conservative (a waiting stream whose next chunk has not arrived is parked by upstream's
chunk adapter inside `schedule`, keeping the others' relative order), so an extra reorder only changes the order
of requests that all run.

With `VLLM_OMNI_TOKEN2WAV_STAGE_STATS` set, the decisions are counted in `token2wav_stage/planner_stats.py`'s
`PlannerStats` and written next to the stage's stats (`<path>.planner.json`) when they change.

Install-time checks (`checks.py`): `schedule(self, throttle_prefills)` exists and its code reads
`max_num_running_reqs` (the only knob the patch turns), `_async_chunk_transport_enabled` is callable,
`vllm_omni.engine.serialization.deserialize_additional_information` resolves. A rename upstream stops the plugin
at start-up instead of silently planning nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.models.token2wav_stage.cost_model import (
    CostModel,
    carries_stream_meta,
    latency_planning_enabled,
    whole_rows_to_admit,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.planner_stats import PlannerStats, PlannerStatsWriter
from vllm_omni_token2wav.model_executor.models.token2wav_stage.playback import PlaybackClock, due_order
from vllm_omni_token2wav.patch.checks import expect_callable, expect_reads, resolve
from vllm_omni_token2wav.patch.register import entry
from vllm_omni_token2wav.patch.worker.patch_generation_scheduler import COST_MODEL_ATTR, PLAYBACK_ATTR

logger = init_logger(__name__)

__all__ = [
    "ROW",
    "check_upstream",
    "install",
    "order_due_streams",
    "planned_running_limit",
    "planner_stats",
    "uninstall",
]

ROW = entry(__name__)
_SCHEDULER = "vllm_omni.core.sched.omni_generation_scheduler.OmniGenerationScheduler"
_DESERIALIZE = "vllm_omni.engine.serialization.deserialize_additional_information"
_MARK = "_token2wav_latency_planning"
_ENABLED_ATTR = "_token2wav_latency_planning_enabled"
_STATS_ATTR = "_token2wav_planner_stats"


def _info(request: Any) -> Any:
    info = getattr(request, "additional_information", None)
    if info is None or isinstance(info, dict):
        return info
    from vllm_omni.engine.serialization import deserialize_additional_information

    return deserialize_additional_information(info)


def _enabled(scheduler: Any) -> bool:
    enabled = getattr(scheduler, _ENABLED_ATTR, None)
    if enabled is None:
        config = getattr(getattr(scheduler, "vllm_config", None), "additional_config", None)
        enabled = latency_planning_enabled(config)
        setattr(scheduler, _ENABLED_ATTR, enabled)
    return enabled


def planner_stats(scheduler: Any) -> PlannerStatsWriter:
    """The scheduler's `PlannerStatsWriter` (created on first use; counts only with the stats variable set)."""
    writer = getattr(scheduler, _STATS_ATTR, None)
    if writer is None:
        writer = PlannerStatsWriter()
        setattr(scheduler, _STATS_ATTR, writer)
    return writer


def order_due_streams(scheduler: Any, stats: PlannerStats | None = None) -> int:
    """Refill the waiting stream requests' places in due order under pressure (module docstring); overtakes."""
    clock: PlaybackClock | None = getattr(scheduler, PLAYBACK_ATTR, None)
    queue = scheduler.waiting
    if clock is None or not isinstance(queue, deque) or len(queue) < 2 or not _enabled(scheduler):
        return 0
    waiting = list(queue)
    free = int(scheduler.max_num_running_reqs) - len(scheduler.running)
    budget = getattr(scheduler, "max_num_scheduled_tokens", None)
    ready = sum(
        max(len(getattr(r, "prompt_token_ids", None) or ()) - int(getattr(r, "num_computed_tokens", 0)), 0)
        for r in waiting
    )
    if len(waiting) <= free and (budget is None or ready <= int(budget)):
        return 0  # everything waiting fits this step: nothing to order (and no request's information is read)
    flags = [clock.audio_s(str(r.request_id)) > 0 or carries_stream_meta(_info(r)) for r in waiting]
    if sum(flags) < 2:
        return 0
    ordered = due_order(waiting, flags, clock)
    if all(a is b for a, b in zip(ordered, waiting, strict=True)):
        return 0
    before = {id(r): i for i, r in enumerate(waiting)}
    overtakes = sum(1 for i, r in enumerate(ordered) if i < before[id(r)])
    queue.clear()
    queue.extend(ordered)
    logger.info_once("latency planning: waiting stream chunks ordered by when their listeners' audio runs out")
    if stats is not None:
        stats.record_reorder(overtakes)
    return overtakes


def planned_running_limit(scheduler: Any, stats: PlannerStats | None = None) -> int | None:
    """This step's `max_num_running_reqs`, or None to schedule as upstream does (the module docstring's rules)."""
    model: CostModel | None = getattr(scheduler, COST_MODEL_ATTR, None)
    if model is None or not _enabled(scheduler) or scheduler._async_chunk_transport_enabled():
        return None
    stock_limit = int(scheduler.max_num_running_reqs)
    running = list(scheduler.running)
    if any(carries_stream_meta(_info(r)) for r in running):
        return None
    free = stock_limit - len(running)
    if free <= 1:
        return None  # nothing to hold back
    tokens: list[int] = []
    for request in scheduler.waiting:
        if carries_stream_meta(_info(request)):
            return None  # a stream chunk waits: never hold it back behind a planned limit
        tokens.append(len(getattr(request, "prompt_token_ids", None) or ()))
        if len(tokens) == free:
            break
    if len(tokens) <= 1:
        return None
    admit = whole_rows_to_admit(tokens, model)
    if stats is not None:
        stats.record_plan(min(max(admit, 1), len(tokens)), len(tokens))
        stats.model = asdict(model)
    # at most one line per (admitted, waiting) pair and process: what the planner does, visible in a server's log
    logger.info_once("latency planning: %d of %d waiting whole utterances admitted in a step", admit, len(tokens))
    logger.debug("latency planning: %d of %d waiting whole utterances this step (%s)", admit, len(tokens), model)
    if admit >= len(tokens):
        return None
    logger.info_once("latency planning holds whole utterances back (fewer rows per step than upstream would run)")
    return len(running) + max(admit, 1)


def check_upstream(cls: type, dotted: str = _SCHEDULER) -> None:
    """Refuse (`UpstreamMismatchError`) unless `cls.schedule` is what the patch was written for (module docstring)."""
    patch, version = ROW.module, ROW.written_against
    schedule = expect_callable(
        patch, version, f"{dotted}.schedule", getattr(cls, "schedule", None), parameters=("self", "throttle_prefills")
    )
    expect_reads(patch, version, schedule, f"{dotted}.schedule", "max_num_running_reqs")
    expect_callable(
        patch,
        version,
        f"{dotted}._async_chunk_transport_enabled",
        getattr(cls, "_async_chunk_transport_enabled", None),
        parameters=("self",),
    )


def _check_engine_helpers() -> None:
    patch, version = ROW.module, ROW.written_against
    expect_callable(patch, version, _DESERIALIZE, resolve(patch, version, _DESERIALIZE))


def _scheduler_classes() -> Iterable[type]:
    return (resolve(ROW.module, ROW.written_against, _SCHEDULER),)


def install() -> None:
    """Check upstream, then wrap `schedule` of vLLM-Omni's generation scheduler. Idempotent."""
    classes = tuple(_scheduler_classes())
    _check_engine_helpers()
    for cls in classes:
        stock = cls.schedule
        if getattr(stock, _MARK, False):
            continue
        check_upstream(cls)

        def schedule(self: Any, *args: Any, _stock: Any = stock, **kwargs: Any) -> Any:
            writer = planner_stats(self)
            stats = writer.target()
            if stats is not None:
                stats.enabled = _enabled(self)
            try:
                order_due_streams(self, stats)
                limit = planned_running_limit(self, stats)
                if limit is None:
                    return _stock(self, *args, **kwargs)
                saved = self.max_num_running_reqs
                self.max_num_running_reqs = limit
                try:
                    return _stock(self, *args, **kwargs)
                finally:
                    self.max_num_running_reqs = saved
            finally:
                writer.write()

        setattr(schedule, _MARK, True)
        schedule.__wrapped__ = stock  # type: ignore[attr-defined]
        cls.schedule = schedule


def uninstall() -> None:
    """Restore the stock `schedule` (tests)."""
    for cls in _scheduler_classes():
        current = cls.schedule
        if getattr(current, _MARK, False):
            cls.schedule = current.__wrapped__
