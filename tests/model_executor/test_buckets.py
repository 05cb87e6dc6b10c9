# SPDX-License-Identifier: Apache-2.0
"""Shape buckets: one definition of the padded shapes, parsed from specs and overridable by environment."""

from __future__ import annotations

import pytest

from vllm_omni_token2wav.model_executor.buckets import (
    Buckets,
    batch_buckets,
    campplus_frame_buckets,
    stage_frame_buckets,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def test_round_up_picks_smallest_bucket_that_holds_the_size() -> None:
    buckets = Buckets((1, 2, 4, 8))
    assert [buckets.round_up(n) for n in (0, 1, 2, 3, 5, 8)] == [1, 1, 2, 4, 8, 8]
    assert buckets.round_up(9) is None
    assert buckets.largest == 8 and 4 in buckets and 3 not in buckets and len(buckets) == 4


def test_multiples_cover_the_limit() -> None:
    assert Buckets.multiples(64, 3000).sizes[-2:] == (2944, 3008)
    assert Buckets.multiples(16, 32).sizes == (16, 32)
    assert Buckets.parse("64:3000") == Buckets.multiples(64, 3000)
    assert Buckets.parse(" 1, 2,4 ") == Buckets((1, 2, 4))


@pytest.mark.parametrize("spec", ["", "a,b", "4,2", "1,1", "0:10", "8:0", "1:2:3", "-1,2"])
def test_bad_specs_name_the_problem(spec: str) -> None:
    with pytest.raises(ValueError, match="VLLM_OMNI_TOKEN2WAV_X"):
        Buckets.parse(spec, what="VLLM_OMNI_TOKEN2WAV_X")


def test_defaults_and_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "VLLM_OMNI_TOKEN2WAV_CAMPP_FRAME_BUCKETS",
        "VLLM_OMNI_TOKEN2WAV_BATCH_BUCKETS",
        "VLLM_OMNI_TOKEN2WAV_STAGE_FRAME_BUCKETS",
    ):
        monkeypatch.delenv(name, raising=False)
    assert campplus_frame_buckets().round_up(200) == 256
    assert campplus_frame_buckets().round_up(3000) == 3008
    assert batch_buckets().sizes == (1, 2, 4, 8, 16, 32)
    assert stage_frame_buckets().round_up(58) == 64
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_BATCH_BUCKETS", "1,3")
    assert batch_buckets().round_up(2) == 3
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_CAMPP_FRAME_BUCKETS", "nonsense")
    with pytest.raises(ValueError, match="VLLM_OMNI_TOKEN2WAV_CAMPP_FRAME_BUCKETS"):
        campplus_frame_buckets()


def test_ranges_continue_above_the_entries_before_them() -> None:
    grid = Buckets.parse("16:256,64:1024,128:2048")
    assert grid.sizes[:3] == (16, 32, 48) and grid.sizes[15:18] == (256, 320, 384)
    assert grid.sizes[-3:] == (1792, 1920, 2048) and len(grid) == 36
    assert Buckets.parse("1,2,4,8:32") == Buckets((1, 2, 4, 8, 16, 24, 32))
    assert grid.round_up(1601) == 1664 and grid.round_up(257) == 320


def test_default_stage_grid_holds_a_full_launch_of_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_OMNI_TOKEN2WAV_STAGE_FRAME_BUCKETS", raising=False)
    # 32 rows (max_num_seqs) of the longest chunk (25 tokens + 3 lookahead -> 56 mel frames).
    assert stage_frame_buckets().round_up(32 * 56) == 1792
    assert stage_frame_buckets().round_up(50) == 64
