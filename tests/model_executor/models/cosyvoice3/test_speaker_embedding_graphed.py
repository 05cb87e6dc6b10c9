# SPDX-License-Identifier: Apache-2.0
"""CAM++ through the device-graph runner: same embeddings as the reference network, one capture per shape.

The graphs come from the fake runtime (`tests/helpers/fake_device_graphs.py`), which replays the
recorded aten ops on the captured memory, so a replay that read stale inputs, skipped a kernel or
depended on a host sync would show here. The reference is the unfolded `CAMPPlus.forward` (upstream's
module tree), not the folded form under test, within the torch path's documented tolerance (max abs
1e-4, docs/design/speaker_embedding.md); replays also equal the eager folded form to 1e-6 (a graph
replays the same kernels).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.fake_device_graphs import fake_graph_api
from tests.helpers.mark import hardware_test
from vllm_omni.model_executor.models.campplus.dtdnn import CAMPPlus
from vllm_omni.model_executor.models.campplus.inference import CampplusInference
from vllm_omni.model_executor.models.campplus.standin import build_standin_campplus
from vllm_omni.model_executor.models.cosyvoice3.speaker_embedding import SpeakerEmbeddingBackend
from vllm_omni.model_executor.models.cosyvoice3.speaker_embedding_graphed import GraphedCampplus


@pytest.fixture(scope="module")
def model() -> CAMPPlus:
    return build_standin_campplus(seed=3, reduced=True).eval()


def _feats(frames: int, seed: int) -> torch.Tensor:
    x = torch.randn(frames, 80, generator=torch.Generator().manual_seed(seed))
    return x - x.mean(dim=0, keepdim=True)


def _reference(model: CAMPPlus, feats: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model(feats.unsqueeze(0))[0].double().numpy()


def _check(got: torch.Tensor, model: CAMPPlus, feats: torch.Tensor) -> None:
    np.testing.assert_allclose(got.double().numpy(), _reference(model, feats), rtol=0, atol=1e-4)
    with torch.inference_mode():
        eager = CampplusInference(model, "cpu")(feats.unsqueeze(0))[0]
    np.testing.assert_allclose(got.numpy(), eager.numpy(), rtol=0, atol=1e-6)


@pytest.mark.core_model
@pytest.mark.cpu
@pytest.mark.parametrize("mode", ["exact", "legacy"])
def test_graphed_embeddings_match_the_reference_network_with_one_capture_per_shape(model: CAMPPlus, mode: str) -> None:
    model.set_seg_pool_mode(mode)
    api, module = fake_graph_api()
    backend = GraphedCampplus(model, "cpu", graph_api=api, warmup_iters=1)
    calls = [(97, 1), (200, 2), (97, 3), (345, 4), (200, 5)]
    for frames, seed in calls:
        feats = _feats(frames, seed)
        got = backend(feats)
        assert got.shape == (1, model.embedding_size)
        _check(got[0], model, feats)
    counters = backend.counters()
    assert (counters.captures, counters.replays, counters.failures) == (3, 5, 0)
    assert sorted(key[0][0] for key in backend.runner.captured_keys()) == [(1, 97, 80), (1, 200, 80), (1, 345, 80)]
    assert len(module.captures) == 3


@pytest.mark.core_model
@pytest.mark.cpu
def test_embed_batch_groups_lengths_into_batched_graphs(model: CAMPPlus) -> None:
    model.set_seg_pool_mode("exact")
    api, _ = fake_graph_api()
    backend = GraphedCampplus(model, "cpu", graph_api=api, warmup_iters=1)
    feats = [_feats(150, 1), _feats(230, 2), _feats(150, 3)]
    out = backend.embed_batch(feats)
    for row, item in zip(out, feats, strict=True):
        np.testing.assert_allclose(row.double().numpy(), _reference(model, item), rtol=0, atol=1e-4)
        with torch.inference_mode():  # padded to its frame bucket, masked exactly: the unpadded eager call
            eager = CampplusInference(model, "cpu")(item.unsqueeze(0))[0]
        np.testing.assert_allclose(row.numpy(), eager.numpy(), rtol=0, atol=1e-6)
    # One graph per (rows, frame bucket): the two 150-frame rows share a [2, 192, 80] launch (+ lengths).
    keys = sorted(key[0][0] for key in backend.runner.captured_keys())
    assert keys == [(1, 256, 80), (2, 192, 80)]


@pytest.mark.core_model
@pytest.mark.cpu
def test_warmup_captures_ahead_and_later_calls_only_replay(model: CAMPPlus) -> None:
    model.set_seg_pool_mode("exact")
    api, module = fake_graph_api()
    backend = GraphedCampplus(model, "cpu", graph_api=api, lazy=False, warmup_iters=1)
    assert backend.warmup(frames=[97, 200], batch_sizes=[1, 2]) == 4
    feats = _feats(200, 9)
    _check(backend(feats)[0], model, feats)
    uncaptured = _feats(120, 10)
    _check(backend(uncaptured)[0], model, uncaptured)
    counters = backend.counters()
    assert counters.captures == 4 and counters.eager_reasons == {"not_captured": 1}
    assert len(module.captures) == 4
    with pytest.raises(ValueError, match=">= 4"):
        backend.warmup(frames=[3])


@pytest.mark.core_model
@pytest.mark.cpu
def test_switched_off_it_is_the_eager_torch_backend(model: CAMPPlus) -> None:
    model.set_seg_pool_mode("exact")
    backend = GraphedCampplus(model, "cpu", enabled=False)
    assert isinstance(backend, SpeakerEmbeddingBackend)
    assert backend.name == "torch-graphs-cpu" and backend.device == torch.device("cpu")
    feats = _feats(97, 1)
    _check(backend(feats)[0], model, feats)
    assert backend.counters().disabled_calls == 1 and backend.counters().captures == 0
    with pytest.raises(ValueError, match="80 mel bins"):
        backend(torch.zeros(50, 40))


@pytest.mark.core_model
@hardware_test(res={"npu": "A2", "cuda": "H100"}, num_cards=1)
def test_real_device_graphs_replay_campplus_like_eager(model: CAMPPlus) -> None:
    """Hardware twin of the fake-runtime tests above: real CUDA / NPU graphs, same kernels as eager."""
    from vllm_omni import platforms
    from vllm_omni.model_executor.models.cosyvoice3.speaker_embedding_torch import CampplusTorch

    device = platforms.current_omni_platform.torch_device()
    model.set_seg_pool_mode("exact")
    backend = GraphedCampplus(model, device, enabled=True)
    eager = CampplusTorch(model, device)
    assert backend.runner.graphs_active, backend.counters().disabled_reason
    for frames, seed in [(97, 1), (200, 2), (97, 3), (345, 4)]:
        feats = _feats(frames, seed).to(device)
        got, want = backend(feats), eager(feats)
        np.testing.assert_allclose(got.cpu().numpy(), want.cpu().numpy(), rtol=0, atol=1e-5)
    counters = backend.counters()
    assert (counters.captures, counters.failures, counters.replays) == (3, 0, 4), counters.summary()
