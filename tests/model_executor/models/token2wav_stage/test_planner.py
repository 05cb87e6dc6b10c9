# SPDX-License-Identifier: Apache-2.0
"""The launch planner as plain data: grouping, ordering, row limits and bucket padding, without a model."""

from __future__ import annotations

import pytest

from vllm_omni_token2wav.model_executor.models.token2wav_stage.backend import ChunkShape
from vllm_omni_token2wav.model_executor.models.token2wav_stage.planner import Launch, PlanItem, plan_step

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def _item(i: int, frames: int, cache: int, voc: tuple[int, int], steps: int = 10) -> PlanItem:
    return PlanItem(i, f"r{i}", ChunkShape(("n", steps), frames, (frames, cache), voc))


STEADY = (58, 3840)
FIRST = (50, 0)


def test_flow_rows_share_a_launch_and_equal_attention_shapes_are_adjacent() -> None:
    items = [
        _item(0, 50, 300, FIRST),
        _item(1, 50, 400, STEADY),
        _item(2, 50, 300, FIRST),
        _item(3, 12, 400, (20, 3840)),
        _item(4, 50, 400, STEADY),
    ]
    plan = plan_step(items, max_rows=8)
    assert plan.flow == (Launch("flow", "('n',10)", (0, 2, 1, 4, 3), 212),)
    assert [(v.key, v.rows) for v in plan.vocoder] == [("(50,0)", (0, 2)), ("(58,3840)", (1, 4)), ("(20,3840)", (3,))]


def test_different_step_counts_never_share_a_flow_launch_and_max_rows_splits() -> None:
    items = [_item(i, 50, 400, STEADY, steps=10 if i < 5 else 5) for i in range(7)]
    plan = plan_step(items, max_rows=2)
    assert [launch.rows for launch in plan.flow] == [(0, 1), (2, 3), (4,), (5, 6)]
    assert [launch.rows for launch in plan.vocoder] == [(0, 1), (2, 3), (4, 5), (6,)]
    with pytest.raises(ValueError, match="max_rows must be >= 1"):
        plan_step(items, max_rows=0)


def test_bucket_padding_comes_from_the_shared_bucket_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_STAGE_FRAME_BUCKETS", "64,128,256")
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_BATCH_BUCKETS", "1,2,4,8")
    items = [_item(i, 50, 400, STEADY) for i in range(3)]
    plan = plan_step(items, max_rows=8, pad_to_buckets=True)
    assert (plan.flow[0].frames, plan.flow[0].pad) == (150, 106)  # -> 256 frames
    assert (len(plan.vocoder[0].rows), plan.vocoder[0].pad) == (3, 1)  # -> 4 rows
    big = plan_step([_item(i, 50, 400, STEADY) for i in range(6)], max_rows=8, pad_to_buckets=True)
    assert big.flow[0].pad == 0  # 300 frames is above the largest bucket: run exactly
    assert plan_step(items, max_rows=8).flow[0].pad == 0  # unpadded by default


def test_the_plan_prints_as_a_table() -> None:
    plan = plan_step([_item(0, 50, 300, FIRST), _item(1, 12, 300, (20, 3840))], max_rows=4)
    text = str(plan)
    assert text.splitlines()[0].startswith("flow     2 rows     62 frames +0    key=('n',10)  [r0, r1]")
    assert "vocoder  1 rows      1 rows +0    key=(20,3840)  [r1]" in text
    assert str(plan_step([], max_rows=4)) == "(nothing to launch)"
