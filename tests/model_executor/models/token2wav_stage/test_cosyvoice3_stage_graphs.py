# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3's stage with its launches replayed from device graphs gives the eager stage's audio, bit for bit.

The graph runtime is the fake one (`tests/helpers/fake_device_graphs.py`: a capture records the aten ops
of the DiT segments / the causal HiFT decoder, a replay re-runs them on the captured buffers). The eager
reference is the same stage class with `token2wav_device_graphs=False` on the same bucketed launch shapes
(`pad_to_buckets=True`), fed the same schedule with the same request ids (they seed each request's noise).
Every chunk of every request and so every whole utterance must be identical, with graphs captured once per
key and replayed, and counted in the stage's graph summary. The switch is honoured: off builds no capture
objects, auto follows the platform (the CPU platform has no graph API: nothing replays).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.fake_device_graphs import fake_graph_api
from tests.model_executor.models.token2wav_stage.test_cosyvoice3_stage import (
    OPTIONS,
    Request,
    _forward,
    _talker_request,
)
from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_code2wav import CosyVoice3Code2Wav

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]


def _stage(cv3_dir: Path, **options: Any) -> CosyVoice3Code2Wav:
    stage = CosyVoice3Code2Wav(model=str(cv3_dir), **{**OPTIONS, **options})
    stage.load_weights([])
    return stage


def _requests(stage: CosyVoice3Code2Wav, prefix: str = "g") -> list[Request]:
    rng = random.Random(3)
    return [
        _talker_request(stage, f"{prefix}{i}", [rng.randrange(6561) for _ in range(n)], voice, join)
        for i, (n, voice, join) in enumerate(((130, 1, 0), (90, 0, 0), (120, 2, 1), (60, 1, 2)))
    ]


def _serve(stage: CosyVoice3Code2Wav, requests: list[Request]) -> list[int]:
    """Every joined request with chunks left sends its next one each step; the flow launch sizes (frames + pad)."""
    sizes, step = [], 0
    while any(r.sent < len(r.chunks) for r in requests):
        ready = [r for r in requests if r.join <= step and r.sent < len(r.chunks)]
        if ready:
            audio, errors = _forward(stage, [r.chunks[r.sent] for r in ready])
            assert errors == [None] * len(ready), errors
            sizes += [launch.frames + launch.pad for launch in stage.executor.last_plan.flow]
            for r, a in zip(ready, audio, strict=True):
                r.audio.append(a)
                r.sent += 1
        step += 1
    return sizes


@pytest.mark.parametrize("final_chunk", ["full_attention", "block_causal"])
def test_graphed_stage_audio_equals_the_eager_stage_every_chunk_and_counts_its_graphs(
    cv3_dir: Path, final_chunk: str
) -> None:
    api, module = fake_graph_api()
    graphed = _stage(cv3_dir, device_graphs=True, device_graph_api=api, final_chunk=final_chunk)
    eager = _stage(cv3_dir, device_graphs=False, pad_to_buckets=True, final_chunk=final_chunk)
    graphs = graphed.backend.graphs
    assert graphs is not None and graphed.backend.graphs_active and graphed.executor.config.pad_to_buckets
    assert eager.backend.graphs is None and not eager.backend.graphs_active

    got, want = _requests(graphed), _requests(eager)
    sizes = _serve(graphed, got)
    assert _serve(eager, want) == sizes
    for a, b in zip(got, want, strict=True):
        assert len(a.audio) == len(b.audio) >= 2
        for k, (x, y) in enumerate(zip(a.audio, b.audio, strict=True)):
            assert torch.equal(x, y), (a.rid, k, float((x - y).abs().max()))  # every chunk
        assert torch.equal(torch.cat(a.audio), torch.cat(b.audio))  # the whole utterance

    # flow: every segment one graph per launch size, a replay per launch and Euler step; full-attention last
    # chunks re-run their utterance eagerly outside the launch (a planned launch of only those runs nothing)
    n_steps = int(OPTIONS["n_timesteps"])
    assert len(set(sizes)) < len(sizes)  # a size recurred: replayed without capturing again
    launched = sizes if final_chunk == "block_causal" else sizes[:-1]  # the last step: every stream's last chunk
    for counters in graphs.flow.counters():
        assert counters.failures == counters.eager_fallbacks == counters.evictions == 0, counters.last_failure
        assert counters.captures == counters.graphs == len(set(launched))
        assert counters.replays == len(launched) * n_steps
    # causal HiFT: steady decodes replayed
    hift = graphs.hift.counters()
    assert hift.failures == 0 and hift.captures >= 1 and hift.replays >= 1
    summary = graphs.summary()
    assert summary["active"] and summary["replays"] == sum(c.replays for c in graphs.counters()) > 0
    assert summary["estimator_eager_launches"] == 0 and summary["estimator_graph_launches"] == len(launched)
    assert len(module.captures) == summary["captures"]

    # the run-time switch (benchmarks compare both on one stage): off runs the eager kernels, no replay
    replays = summary["replays"]
    assert graphed.set_device_graphs(False) is False and not graphed.backend.graphs_active
    _serve(graphed, [_requests(graphed, prefix="off")[1]])
    assert graphs.summary()["replays"] == replays
    assert graphed.set_device_graphs(True) is True


def test_the_switch_is_honoured(cv3_dir: Path) -> None:
    off = _stage(cv3_dir, device_graphs=False)
    assert off.backend.graphs is None and not off.backend.graphs_active and not off.executor.config.pad_to_buckets
    auto = _stage(cv3_dir)  # auto on the CPU platform: built, but no graph API, so nothing replays
    assert auto.backend.graphs is not None and not auto.backend.graphs_active
    assert not auto.executor.config.pad_to_buckets
    forced = _stage(cv3_dir, device_graphs=True, device_graph_api=fake_graph_api()[0])
    assert forced.backend.graphs_active and forced.executor.config.pad_to_buckets
