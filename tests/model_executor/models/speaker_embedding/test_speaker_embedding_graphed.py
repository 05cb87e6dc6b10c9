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
from vllm_omni_token2wav.model_executor.models.speaker_embedding.backend import SpeakerEmbeddingBackend
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.dtdnn import CAMPPlus
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.inference import CampplusInference
from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import build_standin_campplus
from vllm_omni_token2wav.model_executor.models.speaker_embedding.graphed import GraphedCampplus


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


def _shapes(backend: GraphedCampplus) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(features shape, lengths shape) of every captured graph, sorted."""
    keys = backend.runner.captured_keys()
    assert all(len(key) == 2 and key[1][1] == torch.int64 for key in keys), keys  # (features, lengths)
    return sorted((key[0][0], key[1][0]) for key in keys)


@pytest.mark.core_model
@pytest.mark.cpu
@pytest.mark.parametrize("mode", ["exact", "legacy"])
def test_single_calls_replay_one_graph_per_frame_bucket(model: CAMPPlus, mode: str) -> None:
    model.set_seg_pool_mode(mode)
    api, module = fake_graph_api()
    backend = GraphedCampplus(model, "cpu", graph_api=api, warmup_iters=1)
    # 97 and 128 share the 128-frame bucket, 129 is one frame above it, 200 and 256 share 256.
    calls = [(97, 1), (200, 2), (128, 3), (129, 4), (256, 5), (97, 6)]
    for frames, seed in calls:
        feats = _feats(frames, seed)
        got = backend(feats)
        assert got.shape == (1, model.embedding_size)
        _check(got[0], model, feats)  # padded to the bucket, masked exactly: the unpadded eager call
    counters = backend.counters()
    assert (counters.captures, counters.replays, counters.failures) == (3, 6, 0)
    assert _shapes(backend) == [((1, 128, 80), (1,)), ((1, 192, 80), (1,)), ((1, 256, 80), (1,))]
    assert len(module.captures) == 3
    # The runner alone on a call's launch inputs (the device check's graph-replay row) is that graph.
    feats = _feats(150, 7)
    x, lengths = backend.launch_inputs(feats)
    assert tuple(x.shape) == (1, 192, 80) and lengths.tolist() == [150]
    torch.testing.assert_close(backend.runner(x, lengths), backend(feats), rtol=0, atol=0)
    assert backend.counters().captures == 3


@pytest.mark.core_model
@pytest.mark.cpu
@pytest.mark.parametrize("mode", ["exact", "legacy"])
def test_embed_batch_is_keyed_by_batch_bucket_and_frame_bucket(model: CAMPPlus, mode: str) -> None:
    model.set_seg_pool_mode(mode)
    api, _ = fake_graph_api()
    backend = GraphedCampplus(model, "cpu", graph_api=api, warmup_iters=1)
    # Frame buckets: 65, 100, 128 -> 128 (3 rows -> batch bucket 4); 150, 192 -> 192 (2 rows);
    # 230 -> 256 (1 row).
    lengths = [150, 65, 230, 100, 192, 128]
    feats = [_feats(t, seed=i) for i, t in enumerate(lengths)]
    out = backend.embed_batch(feats)
    assert out.shape == (len(lengths), model.embedding_size)
    for row, item in zip(out, feats, strict=True):
        _check(row, model, item)
    assert _shapes(backend) == [((1, 256, 80), (1,)), ((2, 192, 80), (2,)), ((4, 128, 80), (4,))]
    # A second batch of other lengths in the same buckets replays the same three graphs.
    again = [_feats(t, seed=50 + i) for i, t in enumerate([140, 70, 250, 90, 180, 127])]
    out = backend.embed_batch(again)
    for row, item in zip(out, again, strict=True):
        _check(row, model, item)
    assert backend.counters().captures == 3 and len(_shapes(backend)) == 3


@pytest.mark.core_model
@pytest.mark.cpu
def test_warmup_captures_the_bucketed_launches_and_later_calls_only_replay(model: CAMPPlus) -> None:
    model.set_seg_pool_mode("exact")
    api, module = fake_graph_api()
    backend = GraphedCampplus(model, "cpu", graph_api=api, lazy=False, warmup_iters=1)
    # 3 utterances launch as a 4-row batch bucket; 97 and 120 share the 128-frame bucket.
    assert backend.warmup(frames=[97, 120, 200], batch_sizes=[1, 3]) == 4
    assert _shapes(backend) == [
        ((1, 128, 80), (1,)),
        ((1, 256, 80), (1,)),
        ((4, 128, 80), (4,)),
        ((4, 256, 80), (4,)),
    ]
    replays = backend.counters().replays  # the runner verified each capture by one replay
    for frames, seed in [(200, 9), (70, 10)]:  # both in captured buckets
        feats = _feats(frames, seed)
        _check(backend(feats)[0], model, feats)
    batch = [_feats(t, seed=20 + t) for t in (193, 250, 199, 256)]  # 4 rows of the 256 bucket
    for row, item in zip(backend.embed_batch(batch), batch, strict=True):
        _check(row, model, item)
    uncaptured = _feats(300, 11)  # bucket 320: not warmed up, lazy=False runs it eagerly
    _check(backend(uncaptured)[0], model, uncaptured)
    counters = backend.counters()
    assert counters.captures == 4 and counters.replays - replays == 3 and counters.eager_reasons == {"not_captured": 1}
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
    from vllm_omni_token2wav import platforms
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import CampplusTorch

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
