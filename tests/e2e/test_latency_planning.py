# SPDX-License-Identifier: Apache-2.0
"""Latency-aware planning of whole utterances in the real engine (Step-Audio2's code2wav alone, CPU).

One engine per arm (`token2wav_latency_planning` on / off, reduced stand-in, 2 Euler steps). A warm-up lets the
stage measure a solo step and a batched one after its first (unmeasured) step (the stage's own `steps_by_rows`
says when), so the cost model exists; then five whole utterances are submitted at once. The scheduler's
counters (`<stats>.planner.json`, `token2wav_stage/planner_stats.py`) show what it decided: with planning on it
admitted fewer than all waiting requests per step (on this CPU an extra row costs about a request alone); with
it off nothing is planned or held back and the stage ran requests batched (upstream's policy). In both arms
every reply is complete and equal to the same request run through our stage class alone in this process
(<= 1e-5, equal length).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.engines import FAST_STAGE_OPTIONS, SAMPLES_PER_TOKEN, OfflineEngine, deployment
from tests.e2e.references import max_abs, reference_stage, whole_request
from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the latency-planning engine test")

FAMILY = "step_audio2"
TOLERANCE = 1e-5


class Arm:
    """One engine with planning on or off, its stats files and an in-process reference stage."""

    def __init__(self, planning: bool, tmp: Path) -> None:
        from vllm_omni_token2wav.model_executor.models.standin.model_dirs import ensure_engine_model_dir

        self.planning = planning
        self.model = ensure_engine_model_dir(FAMILY)
        options = {**FAST_STAGE_OPTIONS, "token2wav_latency_planning": planning}
        deploy = deployment(tmp, f"{FAMILY}_code2wav", {0: {"additional_config": options}})
        self.stats_path = tmp / "stage_stats.json"
        self.engine = OfflineEngine(self.model, deploy, self.stats_path)
        self._reference: Any = None

    def planner(self) -> dict[str, Any]:
        from vllm_omni_token2wav.model_executor.models.token2wav_stage.planner_stats import planner_stats_path

        path = Path(planner_stats_path(str(self.stats_path)))
        if not path.is_file():
            raise AssertionError(f"{path}: the scheduler never wrote its planner counters (patch not installed?)")
        return json.loads(path.read_text())

    def run_and_check(self, requests: dict[str, dict[str, Any]]) -> None:
        outcomes = self.engine.run({rid: (prompt, None) for rid, prompt in requests.items()})
        if self._reference is None:
            self._reference = reference_stage(FAMILY, self.model, async_chunk=False)
        for rid, prompt in requests.items():
            got = outcomes[rid].final
            want = whole_request(self._reference, rid, prompt["prompt_token_ids"], prompt["additional_information"])
            assert got.shape == want.shape == (SAMPLES_PER_TOKEN * len(prompt["prompt_token_ids"]),), rid
            assert max_abs(got, want) <= TOLERANCE, rid

    def warm_up(self) -> None:
        """Requests until the stage has measured a solo step and a batched one (so a cost model exists)."""
        self.run_and_check(_requests("w0", [30]))  # the stage's first whole step: not measured (one-time costs)
        # alone too: a measured solo step whatever the arrival timing (under load, requests submitted at once may
        # all land in one step, so a solo step cannot be left to the concurrent requests below)
        self.run_and_check(_requests("w1", [29]))
        for attempt in range(3):
            rows = self.engine.counters()["steps_by_rows"]
            if rows.get("1", {}).get("steps", 0) >= 2 and any(int(k) >= 2 for k in rows):
                return
            # submitted at once: without a cost model both arms batch what waits (upstream's policy)
            self.run_and_check(_requests(f"w{attempt + 2}", [28, 33, 26, 31]))
        raise AssertionError(f"no solo and batched step measured after the warm-up: {rows}")


def _requests(tag: str, lengths: list[int]) -> dict[str, dict[str, Any]]:
    rng = np.random.default_rng(zlib.crc32(tag.encode()))
    return {
        f"{tag}r{i}": {"prompt_token_ids": rng.integers(0, 6561, n).tolist(), "additional_information": {"seed": i}}
        for i, n in enumerate(lengths)
    }


@pytest.fixture(scope="module", params=[True, False], ids=["planning", "no_planning"])
def arm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Arm]:
    arm_ = Arm(request.param, tmp_path_factory.mktemp(f"latency_{request.param}"))
    try:
        yield arm_
    finally:
        arm_.engine.close()


def test_concurrent_whole_utterances_are_held_back_only_with_planning_and_stay_exact(arm: Arm) -> None:
    arm.warm_up()
    before = arm.planner()
    steps_before = arm.engine.counters()["steps_by_rows"]

    arm.run_and_check(_requests("m", [36, 25, 44, 30, 40]))

    after = arm.planner()
    steps = {
        k: v["steps"] - steps_before.get(k, {"steps": 0})["steps"]
        for k, v in arm.engine.counters()["steps_by_rows"].items()
    }
    decided = {k: n - before["admitted"].get(k, 0) for k, n in after["admitted"].items()}
    decided = {k: n for k, n in decided.items() if n}
    detail = f"planner before {before}, after {after}; steps by rows this round {steps}"
    assert after["enabled"] is arm.planning, detail
    if arm.planning:
        assert after["model"] is not None and after["model"]["solo_seen"] and after["model"]["batch_seen"], detail
        assert after["held_back_requests"] > before["held_back_requests"], detail
        assert after["held_back_steps"] > before["held_back_steps"], detail
        held = [k for k in decided if int(k.split("/")[0]) < int(k.split("/")[1])]
        assert held, detail  # a step admitted fewer than the whole utterances waiting
        assert max(int(k) for k, n in steps.items() if n) < 5, detail  # never all five in one step
    else:
        assert after["planned_steps"] == 0 and after["held_back_requests"] == 0, detail
        assert max(int(k) for k, n in steps.items() if n) >= 2, detail  # upstream's policy batches what waits
