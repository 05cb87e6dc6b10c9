# SPDX-License-Identifier: Apache-2.0
"""What the latency planner decided, as cumulative counters in a JSON file next to the stage's stats (issue 32).

Why a file of its own: the planner runs in vLLM-Omni's engine-core process (the scheduler patch
`patch/worker/patch_latency_planning.py`), the stage's `StageStats` (`stats.py`) are written by the worker that
runs the model, and the engine tests read neither process's memory. With `VLLM_OMNI_TOKEN2WAV_STAGE_STATS=<path>`
set, the scheduler writes its `PlannerStats` to `planner_stats_path(<path>)` = `<path>.planner.json`,
atomically, after each `schedule` call that changed them (at most once per
`VLLM_OMNI_TOKEN2WAV_STAGE_STATS_INTERVAL_S`, as the stage does). Unset, nothing is counted.

| field                | meaning (cumulative)                                                                       |
|----------------------|--------------------------------------------------------------------------------------------|
| `pid`                | the engine-core process                                                                    |
| `enabled`            | the stage's `token2wav_latency_planning` as the scheduler read it                          |
| `planned_steps`      | calls where the whole-utterance rule ran (a cost model, two or more waiting, free slots)   |
| `held_back_steps`    | planned steps that admitted fewer whole utterances than were waiting (within free slots)   |
| `held_back_requests` | the sum over those steps of waiting minus admitted                                         |
| `admitted`           | `"<admitted>/<waiting>"` -> planned steps that decided so                                  |
| `due_reorders`       | calls where waiting stream chunks were put in due order (more ready than a step takes)     |
| `due_overtakes`      | stream chunks that moved ahead in those calls                                              |
| `model`              | the latest cost model the stage published (`cost_model.CostModel` fields), null before    |
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from vllm_omni_token2wav import envs
from vllm_omni_token2wav.atomic_io import write_json_atomic
from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

__all__ = ["PLANNER_SUFFIX", "PlannerStats", "PlannerStatsWriter", "planner_stats_path"]

#: Appended to `VLLM_OMNI_TOKEN2WAV_STAGE_STATS` to name the planner's file.
PLANNER_SUFFIX = ".planner.json"


def planner_stats_path(stage_stats_path: str) -> str:
    """Where the scheduler writes its counters for a stage writing its own to `stage_stats_path`."""
    return f"{stage_stats_path}{PLANNER_SUFFIX}"


@dataclass
class PlannerStats:
    """The counters of the module table (one instance per scheduler, updated in place)."""

    pid: int = field(default_factory=os.getpid)
    enabled: bool = True
    planned_steps: int = 0
    held_back_steps: int = 0
    held_back_requests: int = 0
    admitted: dict[str, int] = field(default_factory=dict)
    due_reorders: int = 0
    due_overtakes: int = 0
    model: dict[str, Any] | None = None

    def record_plan(self, admitted: int, waiting: int) -> None:
        """One planned step: `admitted` of the `waiting` whole utterances run."""
        self.planned_steps += 1
        key = f"{admitted}/{waiting}"
        self.admitted[key] = self.admitted.get(key, 0) + 1
        if admitted < waiting:
            self.held_back_steps += 1
            self.held_back_requests += waiting - admitted

    def record_reorder(self, overtakes: int) -> None:
        """One call that put the waiting stream chunks in due order; `overtakes` of them moved ahead."""
        self.due_reorders += 1
        self.due_overtakes += overtakes


class PlannerStatsWriter:
    """Keeps a scheduler's `PlannerStats`; writes them when `VLLM_OMNI_TOKEN2WAV_STAGE_STATS` is set."""

    def __init__(self) -> None:
        self.stats: PlannerStats | None = None
        self._written: dict[str, Any] | None = None
        self._last_write = float("-inf")
        self._failed = False

    def target(self) -> PlannerStats | None:
        """The counters to update, or None when the variable is unset (then nothing is counted)."""
        if envs.stage_stats_path() is None:
            return None
        if self.stats is None:
            self.stats = PlannerStats()
        return self.stats

    def write(self) -> None:
        """Write the counters if they changed (and the interval allows); a failure is logged once, never raised."""
        path = envs.stage_stats_path()
        if path is None or self.stats is None:
            return
        data = asdict(self.stats)
        if data == self._written:
            return
        now = time.perf_counter()
        try:
            interval = envs.stage_stats_interval_s()
        except ValueError:
            interval = 0.0  # the stage logs the malformed value
        if now - self._last_write < interval:
            return
        self._last_write = now
        try:
            write_json_atomic(planner_stats_path(path), data)
            self._written = data
        except OSError as exc:
            if not self._failed:
                logger.warning("token2wav latency planner: cannot write %s: %s", planner_stats_path(path), exc)
            self._failed = True
