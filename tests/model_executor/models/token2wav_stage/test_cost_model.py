# SPDX-License-Identifier: Apache-2.0
"""The measured cost model of whole-utterance steps and the admission rule the scheduler patch applies.

The estimator is fed steps timed by a known linear cost (the reference) and must recover it; the admission
counts are worked out by hand from the rule in `cost_model.py`'s docstring for a CPU-like model (an extra row
costs nearly a request alone) and an accelerator-like one (rows are cheap). The stream keys are checked against
every registered family's own stream fields.
"""

from __future__ import annotations

import random

import pytest
import torch

from vllm_omni_token2wav.model_executor.models.token2wav_stage.cost_model import (
    STREAM_META_KEYS,
    CostEstimator,
    CostModel,
    carries_stream_meta,
    latency_planning_enabled,
    whole_rows_to_admit,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import registered_families

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

#: A CPU-like step: little fixed cost, each row costs about a request alone.
CPU = CostModel(base_s=0.02, row_s=0.01, token_s=0.004, samples=10, solo_seen=True, batch_seen=True)
#: An accelerator-like step: a large fixed cost (launches), rows almost free.
ACCEL = CostModel(base_s=0.20, row_s=0.002, token_s=0.00002, samples=10, solo_seen=True, batch_seen=True)


def test_the_estimator_recovers_a_known_linear_cost() -> None:
    rng = random.Random(0)
    est = CostEstimator()
    for _ in range(60):
        rows = rng.randint(1, 8)
        tokens = sum(rng.randint(20, 200) for _ in range(rows))
        est.record(rows, tokens, 0.05 + 0.01 * rows + 0.002 * tokens)
    model = est.model()
    assert model is not None and model.solo_seen and model.batch_seen
    assert model.base_s == pytest.approx(0.05, rel=0.02)
    assert model.row_s == pytest.approx(0.01, rel=0.05)
    assert model.token_s == pytest.approx(0.002, rel=0.02)


def test_the_estimator_follows_a_change_and_keeps_what_recent_steps_cannot_tell() -> None:
    est = CostEstimator()
    rng = random.Random(1)
    for _ in range(40):  # identify everything first
        rows = rng.randint(1, 4)
        tokens = rows * 100
        est.record(rows, tokens + rng.randint(0, 50), 0.1 + 0.02 * rows + 0.001 * tokens)
    before = est.model()
    assert before is not None
    for _ in range(200):  # then only solo steps of one length: the slope in rows is not excited any more
        est.record(1, 100, 0.1 + 0.02 + 0.001 * 100)
    after = est.model()
    assert after is not None
    assert after.alone_s(100) == pytest.approx(0.22, rel=0.01)
    assert after.marginal_s(100) == pytest.approx(before.marginal_s(100), rel=0.1)


def test_no_model_before_two_steps_and_bad_measurements_are_ignored() -> None:
    est = CostEstimator()
    est.record(2, 100, 0.5)
    assert est.model() is None
    est.record(0, 0, 0.5)
    est.record(1, 10, float("nan"))
    est.record(1, 10, -1.0)
    assert est.model() is None
    est.record(1, 50, 0.3)
    assert est.model() is not None


def test_encode_decode_round_trip_and_rejects() -> None:
    assert CostModel.decode(CPU.encode()) == CPU
    assert CostModel.decode(torch.empty(0, dtype=torch.float64)) is None
    assert CostModel.decode(None) is None
    assert CostModel.decode(torch.zeros(5, dtype=torch.float64)) is None
    assert CostModel.decode(torch.tensor([float("inf")] * 6, dtype=torch.float64)) is None


def test_a_cpu_like_model_admits_one_at_a_time() -> None:
    # second row: 2 * (0.01 + 0.004 * 100) = 0.82 > alone 0.43 -> refused
    assert whole_rows_to_admit([100, 100, 100, 100], CPU) == 1


def test_an_accelerator_like_model_batches_while_rows_are_cheap() -> None:
    # marginal(100) = 0.004, alone(100) = 0.204: (k + 1) * 0.004 <= 0.204 for k + 1 <= 51 -> all eight
    assert whole_rows_to_admit([100] * 8, ACCEL) == 8
    # a long one (marginal 0.002 + 0.00002 * 20000 = 0.402 > alone / 2) stops the batch at that row
    assert whole_rows_to_admit([100, 100, 20000, 100], ACCEL) == 2


def test_probe_rules_without_a_solo_or_a_batched_step() -> None:
    no_solo = CostModel(0.1, 0.1, 0.0, 3, solo_seen=False, batch_seen=True)
    no_batch = CostModel(0.1, 0.1, 0.0, 3, solo_seen=True, batch_seen=False)
    assert whole_rows_to_admit([10, 10, 10], no_solo) == 1
    assert whole_rows_to_admit([10, 10, 10], no_batch) == 2
    assert whole_rows_to_admit([10], no_batch) == 1
    assert whole_rows_to_admit([], CPU) == 0


def test_stream_keys_cover_every_family_and_are_found_where_producers_put_them() -> None:
    for fam in registered_families():
        spec = fam.spec
        for key in (spec.last_chunk_key, spec.prefix_offset_key, spec.end_marker_key):
            if key is not None:
                assert key in STREAM_META_KEYS, (fam.name, key)
    assert carries_stream_meta({"meta": {"chunk_seq": 0}})
    assert carries_stream_meta({"meta.left_context_size": 3})
    assert carries_stream_meta({"finished": True})
    assert not carries_stream_meta({"meta": {"chunk_seq": None}, "ref_audio": "x.wav"})
    assert not carries_stream_meta(None)


_KEY = "token2wav_latency_planning"


@pytest.mark.parametrize(
    ("config", "expected"),
    [(None, True), ({}, True), ({_KEY: False}, False), ({_KEY: "off"}, False), ({_KEY: "true"}, True), ("x", True)],
)
def test_the_off_switch(config: object, expected: bool) -> None:
    assert latency_planning_enabled(config) is expected


def test_a_bad_switch_value_names_the_key() -> None:
    with pytest.raises(ValueError, match="token2wav_latency_planning"):
        latency_planning_enabled({"token2wav_latency_planning": "sometimes"})


def test_the_fit_never_makes_a_row_or_a_token_cost_negative() -> None:
    # a noisy host: the batched step ran faster than the solo one (unconstrained: row_s < 0, "a row saves time")
    est = CostEstimator()
    est.record(1, 30, 1.06)
    est.record(2, 61, 0.69)
    model = est.model()
    assert model is not None
    assert model.base_s >= 0 and model.row_s >= 0 and model.token_s >= 0
    assert model.alone_s(30) == pytest.approx(model.base_s + model.row_s + 30 * model.token_s)
    unconstrained = torch.linalg.lstsq(
        torch.tensor([[1.0, 1.0, 30.0], [1.0, 2.0, 61.0]], dtype=torch.float64),
        torch.tensor([1.06, 0.69], dtype=torch.float64),
    ).solution
    assert float(unconstrained.min()) < 0  # the data itself asks for a negative coefficient
