# SPDX-License-Identifier: Apache-2.0
"""Bucketed batches of CAM++: the launch plan, and `embed_batch` / `embed_padded` on it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.model_executor.models.speaker_embedding.campplus.helpers import speaker_feats
from vllm_omni_token2wav.model_executor.buckets import Buckets, batch_buckets, campplus_frame_buckets
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.batching import Launch, plan_launches

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

FRAMES = Buckets.multiples(64, 3000)
ROWS = Buckets((1, 2, 4, 8))


def test_plan_groups_by_frame_bucket_in_request_order() -> None:
    plan = plan_launches([97, 200, 65, 128, 3100, 64, 129, 3500], FRAMES, ROWS, pad_rows=False)
    assert plan == [
        Launch((5,), 64, 1, True),
        Launch((0, 2, 3), 128, 3, True),
        Launch((6,), 192, 1, True),
        Launch((1,), 256, 1, True),
        Launch((4, 7), 3500, 2, False),  # above the largest bucket: one exact-shape group
    ]


def test_plan_pads_rows_to_batch_buckets_and_chunks_by_the_largest() -> None:
    plan = plan_launches([100] * 11, FRAMES, ROWS, pad_rows=True)
    assert [(len(p.indices), p.rows, p.frames) for p in plan] == [(8, 8, 128), (3, 4, 128)]
    assert sorted(i for p in plan for i in p.indices) == list(range(11))


def test_plan_rejects_empty_and_non_positive_lengths() -> None:
    with pytest.raises(ValueError, match="at least one"):
        plan_launches([], FRAMES, ROWS, pad_rows=False)
    with pytest.raises(ValueError, match="utterance 1 has 0 frames"):
        plan_launches([5, 0], FRAMES, ROWS, pad_rows=False)


@pytest.fixture(scope="module")
def backend(reduced_standin: Path):
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import (
        CampplusTorch,
        load_campplus_from_onnx,
    )

    return CampplusTorch(load_campplus_from_onnx(reduced_standin, seg_pool_mode="exact"), "cpu")


def test_embed_batch_launches_bucket_shapes_and_rows_equal_single_calls(
    backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    lengths = [97, 4, 200, 65, 128, 257, 129]
    feats = [speaker_feats(t, offset=1000 * i) for i, t in enumerate(lengths)]
    shapes: list[tuple[int, int]] = []
    real = backend._impl

    def spy(x: torch.Tensor, lens: torch.Tensor | None = None) -> torch.Tensor:
        shapes.append((x.shape[0], x.shape[1]))
        return real(x, lens)

    monkeypatch.setattr(backend, "_impl", spy)
    batch = backend.embed_batch(feats)
    monkeypatch.setattr(backend, "_impl", real)
    frame_buckets = campplus_frame_buckets()
    assert sorted(shapes) == [(1, 64), (1, 192), (1, 256), (1, 320), (3, 128)]
    assert all(frames in frame_buckets for _, frames in shapes)
    for i, feat in enumerate(feats):
        diff = (batch[i : i + 1] - backend(feat)).abs().max().item()
        assert diff <= 1e-6, f"row {i} (T={lengths[i]}): {diff:.2e}"


def test_off_cpu_rows_are_padded_to_a_batch_bucket(backend, monkeypatch: pytest.MonkeyPatch) -> None:
    # The row padding rule is the device's; exercise it on the CPU model by flipping the device test.
    from vllm_omni_token2wav.model_executor.models.speaker_embedding import torch_backend as set_

    calls: list[dict] = []
    real = set_.plan_launches

    def recording(lengths, frame_buckets, row_buckets, *, pad_rows):
        calls.append({"pad_rows": pad_rows})
        return real(lengths, frame_buckets, row_buckets, pad_rows=True)

    monkeypatch.setattr(set_, "plan_launches", recording)
    feats = [speaker_feats(t) for t in (97, 100, 110)]
    shapes: list[int] = []
    real_impl = backend._impl
    monkeypatch.setattr(backend, "_impl", lambda x, lens=None: (shapes.append(x.shape[0]), real_impl(x, lens))[1])
    batch = backend.embed_batch(feats)
    monkeypatch.setattr(backend, "_impl", real_impl)
    assert calls == [{"pad_rows": False}]  # the CPU asks for no row padding ...
    assert shapes == [batch_buckets().round_up(3)]  # ... and a padded plan still gives exact rows
    for i, feat in enumerate(feats):
        assert (batch[i : i + 1] - backend(feat)).abs().max().item() <= 1e-6


def test_embed_padded_checks_shapes_and_lengths(backend) -> None:
    x = torch.zeros(2, 64, 80)
    with pytest.raises(ValueError, match=r"float32 features \[B, T, 80\]"):
        backend.embed_padded(torch.zeros(2, 64, 40), torch.tensor([64, 64]))
    with pytest.raises(ValueError, match="2 entries but the features have 3 rows"):
        backend.embed_padded(torch.zeros(3, 64, 80), torch.tensor([64, 64]))
    with pytest.raises(ValueError, match=r"\[4, 64\]"):
        backend.embed_padded(x, torch.tensor([64, 70]))
    assert backend.embed_padded(x, torch.tensor([64, 10])).shape == (2, backend.embedding_size)


def test_embed_batch_names_the_bad_item(backend) -> None:
    with pytest.raises(ValueError, match="embed_batch item 1: .*T >= 4"):
        backend.embed_batch([torch.zeros(50, 80), torch.zeros(3, 80)])


def test_cpu_calls_give_up_the_cores_other_threads_hold(backend, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_omni_token2wav.platforms.cpu import threads

    feat = speaker_feats(97)
    seen: list[int] = []
    real = backend._impl

    def spy(x: torch.Tensor, lens: torch.Tensor | None = None) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return real(x, lens)

    monkeypatch.setattr(backend, "_impl", spy)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setattr(threads, "other_runnable_threads", lambda: 0)
        quiet = backend(feat)
        monkeypatch.setattr(threads, "other_runnable_threads", lambda: 1)
        busy = backend(feat)
        assert backend.last_call_threads == 1 and torch.get_num_threads() == 2  # restored after the call
        backend.embed_batch([feat, speaker_feats(200)])
    finally:
        torch.set_num_threads(previous)
    assert seen == [2, 1, 1, 1]  # one choice for all launches of a batch
    assert torch.equal(quiet, busy)  # the thread count changes the speed, not the result


def test_the_thread_sample_comes_before_the_input_checks(backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks run parallel ops; sampled after them, the OpenMP workers they woke (still spinning)
    counted as other runnable threads and a quiet 2-core host gave every call 1 thread (measured)."""
    from vllm_omni_token2wav.model_executor.models.speaker_embedding import torch_backend as set_

    order: list[str] = []
    real_sample, real_check = set_.call_threads, set_.validate_speaker_features
    monkeypatch.setattr(set_, "call_threads", lambda budget: (order.append("sample"), real_sample(budget))[1])
    monkeypatch.setattr(set_, "validate_speaker_features", lambda feat: (order.append("check"), real_check(feat))[1])
    backend(speaker_feats(97))
    assert order == ["sample", "check"]
    order.clear()
    backend.embed_batch([speaker_feats(97), speaker_feats(200)])
    assert order == ["sample", "check", "check"]


def test_embed_batch_never_waits_for_the_device(reduced_standin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On an accelerator a host read stalls the launching thread (and cannot be captured). The device is
    faked by `meta` under `HostSyncCounter` (tests/helpers/host_sync.py), which records every such site."""
    from tests.helpers.host_sync import HostSyncCounter
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import (
        CampplusTorch,
        load_campplus_from_onnx,
    )

    meta = torch.device("meta")
    backend = CampplusTorch(load_campplus_from_onnx(reduced_standin, seg_pool_mode="exact"), meta)
    # Buckets 192 (row 0), 128 (rows 1 and 3: not consecutive, an index scatter), 256 (row 2).
    feats = [torch.empty(t, 80, device=meta) for t in (150, 65, 230, 100)]
    with HostSyncCounter() as syncs:
        out = backend.embed_batch(feats)
        padded = backend.embed_padded(torch.empty(2, 128, 80, device=meta), torch.tensor([100, 65]))
    assert syncs.sites == [], syncs.report()
    assert out.shape == (4, backend.embedding_size) and out.device == meta and padded.shape == (2, out.shape[1])

    def blocking_scatter(out: torch.Tensor, indices: tuple[int, ...], rows: torch.Tensor) -> None:
        out[torch.tensor(indices, device=meta)] = rows  # the former form: a pageable copy that waits

    monkeypatch.setattr(backend, "_scatter", blocking_scatter)
    with HostSyncCounter() as syncs:
        backend.embed_batch(feats)
    assert [s.kind for s in syncs.sites] == ["blocking-host-to-device"] * 3  # one per launch
