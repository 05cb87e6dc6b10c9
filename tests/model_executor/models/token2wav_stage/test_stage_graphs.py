# SPDX-License-Identifier: Apache-2.0
"""Stage launches replayed from device graphs give the eager stage's audio, with bounded, counted captures.

The graph runtime is the fake one (`tests/helpers/fake_device_graphs.py`): a capture records the
aten ops of the estimator segments / HiFT network and a replay re-runs them on the captured
buffers (Python does not run again; a host sync inside a capture would fail it). The eager
reference is the same stage class without graphs, on the same bucketed launch shapes
(`pad_to_buckets=True`), fed the same seeded schedule. Expected capture keys are derived from the
launch plans the engine printed, not from the runners.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.fake_device_graphs import fake_graph_api
from tests.model_executor.models.token2wav_stage.conftest import FAST_OPTIONS
from tests.model_executor.models.token2wav_stage.test_stage_batching import Request, _forward, _schedule
from vllm_omni_token2wav import envs
from vllm_omni_token2wav.model_executor import buckets
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav import MiniCPMO45Code2Wav
from vllm_omni_token2wav.model_executor.models.token2wav_stage.planner import StepPlan
from vllm_omni_token2wav.model_executor.models.token2wav_stage.stage_model import Token2WavStageModel

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]

MAX_ROWS = 4


def _run(stage: Token2WavStageModel, requests: list[Request], seed: int) -> list[StepPlan]:
    """Each step every joined request with chunks left sends its next one with probability 0.7; the plans."""
    rng = random.Random(seed)
    plans, step = [], 0
    while any(r.sent < len(r.chunks) for r in requests):
        ready = [r for r in requests if r.join <= step and r.sent < len(r.chunks) and rng.random() < 0.7]
        if ready:
            audio, errors = _forward(stage, [r.chunks[r.sent] for r in ready])
            assert errors == [None] * len(ready), errors
            plans.append(stage.executor.last_plan)
            for r, a in zip(ready, audio, strict=True):
                r.audio.append(a)
                r.sent += 1
        step += 1
    return plans


def _stage(model_dir: Path, **options: object) -> MiniCPMO45Code2Wav:
    stage = MiniCPMO45Code2Wav(model=str(model_dir), **{"max_rows": MAX_ROWS, **FAST_OPTIONS, **options})
    stage.load_weights([])
    return stage


def _requests(voices: list[tuple[np.ndarray, int]], prefix: str) -> list[Request]:
    requests = _schedule(MiniCPMO45Code2Wav, voices, n=5, seed=11)
    for r in requests:
        r.chunks = [replace(c, request_id=f"{prefix}-{c.request_id}") for c in r.chunks]
    return requests


def _assert_same_audio(got: list[Request], want: list[Request]) -> None:
    for a, b in zip(got, want, strict=True):
        assert len(a.audio) == len(b.audio)
        assert all(torch.equal(x, y) for x, y in zip(a.audio, b.audio, strict=True)), a.rid  # bit-equal


def test_captured_stage_audio_equals_the_eager_stage_and_each_key_is_captured_once(
    model_dir: Path, voices: list[tuple[np.ndarray, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    api, module = fake_graph_api()
    graphed = _stage(model_dir, device_graphs=True, device_graph_api=api)
    eager = _stage(model_dir, device_graphs=False, pad_to_buckets=True)
    graphs = graphed.backend.graphs
    assert graphs is not None and graphs.active and graphed.executor.config.pad_to_buckets
    assert eager.backend.graphs is None

    # Same request ids (they seed each request's noise) on stages that share nothing.
    plans = _run(graphed, got := _requests(voices, "g"), seed=12)
    eager_plans = _run(eager, want := _requests(voices, "g"), seed=12)
    _assert_same_audio(got, want)
    assert [p.describe() for p in plans] == [p.describe() for p in eager_plans]

    # The LRU cap: two graphs per runner force evictions and recaptures, and the audio stays exact.
    monkeypatch.setenv(envs.DEVICE_GRAPHS_MAX_ENV, "2")
    capped = _stage(model_dir, device_graphs=True, device_graph_api=fake_graph_api()[0])
    _run(capped, capped_requests := _requests(voices, "g"), seed=12)
    _assert_same_audio(capped_requests, want)
    assert capped.backend.graphs is not None
    capped_counters = capped.backend.graphs.counters()
    assert all(c.graphs <= 2 and c.failures == 0 for c in capped_counters)
    assert all(c.evictions == c.captures - c.graphs for c in capped_counters)
    assert capped_counters[0].evictions > 0  # more flow sizes than the cap

    # Estimator: one graph per launch size (frames + padding, a bucket), in every segment; a replay per step.
    flow_sizes = [launch.frames + launch.pad for p in plans for launch in p.flow]
    n_steps = int(FAST_OPTIONS["n_timesteps"])  # type: ignore[call-overload]
    for counters in graphs.estimator.counters():
        assert counters.failures == counters.eager_fallbacks == counters.evictions == 0, counters.last_failure
        assert counters.captures == counters.graphs == len(set(flow_sizes))
        assert counters.replays == len(flow_sizes) * n_steps
    seg0 = graphs.keys()["flow-estimator.seg00"]
    assert sorted(key[0][0][2] for key in seg0) == sorted(set(flow_sizes))  # x [2, 80, N]

    # HiFT: a (rows + padding, mel frames, cached samples) shape is captured at its 2nd launch.
    # The vocoder launch key is "(mel frames,cached source samples,held samples,device)".
    shapes = Counter(
        (len(launch.rows) + launch.pad, *launch.key.strip("(").split(",")[:2]) for p in plans for launch in p.vocoder
    )
    hift = graphs.hift.counters()
    recurring = [s for s, n in shapes.items() if n >= 2]
    assert hift.failures == 0 and hift.captures == len(recurring) >= 2
    assert hift.replays == sum(n - 1 for n in shapes.values() if n >= 2)
    assert hift.eager_reasons == {"below_capture_after": sum(shapes.values()) - hift.replays}
    assert len(module.captures) == sum(c.captures for c in graphs.counters())


def test_graphs_follow_the_switch_and_the_platform(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, voices: list[tuple[np.ndarray, int]]
) -> None:
    api, module = fake_graph_api()
    monkeypatch.setenv(envs.DEVICE_GRAPHS_ENV, "0")
    off_by_env = _stage(model_dir, device_graph_api=api)  # auto follows the environment
    assert off_by_env.backend.graphs is not None and not off_by_env.backend.graphs.active
    assert not off_by_env.executor.config.pad_to_buckets  # eager launches keep their exact shapes
    forced = _stage(model_dir, device_graphs="true", device_graph_api=api)  # True wins over the environment
    assert forced.backend.graphs is not None and forced.backend.graphs.active
    monkeypatch.delenv(envs.DEVICE_GRAPHS_ENV)
    on_cpu = _stage(model_dir)  # auto on the CPU platform: no graph API, eager, unpadded
    assert on_cpu.backend.graphs is not None and not on_cpu.backend.graphs.active
    assert not on_cpu.executor.config.pad_to_buckets
    requests = _requests(voices, "s")[:2]
    _run(off_by_env, requests, seed=13)
    assert not module.captures  # nothing was captured by the stage that is off
    counters = off_by_env.backend.graphs.counters()
    assert all(c.captures == c.replays == 0 for c in counters)
    with pytest.raises(ValueError, match="token2wav_device_graphs must be true, false or auto"):
        MiniCPMO45Code2Wav(model=str(model_dir), device_graphs="sometimes", **FAST_OPTIONS)


@pytest.mark.parametrize("concurrency", [8, 32])
def test_capture_keys_at_concurrency_8_and_32_are_bucket_sizes_and_few(
    model_dir: Path, voices: list[tuple[np.ndarray, int]], concurrency: int
) -> None:
    """The keys a c-request run would capture, from its launch plans (the first test ties plans to runner keys).

    Eager stage with bucketed launches (the graphed stage plans the same launches); requests of
    12..96 tokens joining over the first steps, each step a random 70 % of them sending a chunk.
    """
    stage = _stage(model_dir, device_graphs=False, pad_to_buckets=True, max_rows=concurrency)
    requests = _schedule(MiniCPMO45Code2Wav, voices, n=concurrency, seed=5)
    plans = _run(stage, requests, seed=6)
    flow = [launch for p in plans for launch in p.flow]
    vocoder = [launch for p in plans for launch in p.vocoder]
    assert max(len(launch.rows) for launch in flow) > concurrency // 2  # the run did batch

    frames, rows = buckets.stage_frame_buckets(), buckets.batch_buckets()
    estimator_keys = {launch.frames + launch.pad for launch in flow}
    assert all(n in frames for n in estimator_keys)  # every launch landed on a bucket
    largest = frames.round_up(56 * concurrency)  # a full launch of the longest chunks
    assert largest is not None
    assert len(estimator_keys) <= min(len(flow), len([n for n in frames.sizes if n <= largest]))

    # HiFT: (rows bucket, mel frames, cached samples); only shapes seen twice are captured (capture_after=2).
    shapes = Counter((len(launch.rows) + launch.pad, *launch.key.strip("(").split(",")[:2]) for launch in vocoder)
    assert all(shape[0] in rows and shape[0] <= concurrency for shape in shapes)
    chunk_shapes = {shape[1:] for shape in shapes}  # first chunks, steady-state chunks, last chunks
    hift_keys = [shape for shape, n in shapes.items() if n >= 2]
    assert len(hift_keys) <= len([b for b in rows.sizes if b <= concurrency]) * len(chunk_shapes)
    # Measured (docs/design/token2wav_stage.md, "Graph capture"): 6 / 7 estimator keys at c = 8 / 32.
    assert len(estimator_keys) <= 8 and len(hift_keys) <= 12, (sorted(estimator_keys), hift_keys)
