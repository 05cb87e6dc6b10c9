# SPDX-License-Identifier: Apache-2.0
"""Two replicas of our code2wav stage in one deployment (`num_replicas: 2`), streamed, driven by the real engine.

vLLM-Omni 0.30 keeps every chunk of a streamed request on one replica without help from the stage: the
orchestrator submits the downstream request once (its async-chunk pre-warm) to the replica its stage
pool picks round-robin and binds it there, and each replica's scheduler fetches from the connector only
the chunks of the requests it holds (docs/design/token2wav_stage.md, "Replicas", names the code). What the
stage keeps per request (stream state, noise, voice) therefore lives in the one replica that serves it.

This module checks that on the stand-in Step-Audio2 stream pipeline (`standin_step_audio2_stream.yaml`,
the one `test_stream.py` runs) with the code2wav stage doubled: concurrent streamed requests, each reply
whole (960 samples per code) and equal (<= 1e-5) to the same codes chunked by upstream's function and
streamed through our stage alone in this process, every request served by exactly one replica with
exactly the chunks upstream cut, and requests on both replicas (two worker processes). Each replica
writes its own counters (`{replica}` in `VLLM_OMNI_TOKEN2WAV_STAGE_STATS`, `envs.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.engines import FAST_STAGE_OPTIONS, SAMPLES_PER_TOKEN, OfflineEngine, StageCounters, deployment
from tests.e2e.references import max_abs, new_tokens, reference_stage, streamed_request, upstream_chunks
from tests.helpers.engine import require_engine
from vllm_omni_token2wav.envs import REPLICA_PLACEHOLDER

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the replica engine tests")

FAMILY = "step_audio2"
REPLICAS = 2
TOLERANCE = 1e-5
#: Codes per request: chunk-boundary ends (50, 75, 100) and remainders; 2 to 4 chunks each.
LENGTHS = (53, 75, 100, 61, 50, 78)


@pytest.fixture(scope="module")
def replica_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OfflineEngine]:
    from vllm_omni_token2wav.model_executor.models.standin.model_dirs import ensure_engine_model_dir

    tmp = tmp_path_factory.mktemp("replicas")
    deploy = deployment(
        tmp,
        f"standin_{FAMILY}_stream",
        {1: {"additional_config": FAST_STAGE_OPTIONS, "num_replicas": REPLICAS}},
    )
    engine = OfflineEngine(ensure_engine_model_dir(FAMILY), deploy, tmp / f"stage_stats_{REPLICA_PLACEHOLDER}.json")
    try:
        yield engine
    finally:
        engine.close()


def replica_counters(engine: OfflineEngine) -> list[StageCounters]:
    """Each replica's counters (`stage_stats_<replica>.json`), replica 0 first."""
    path = str(engine.stats_path)
    return [StageCounters.read(Path(path.replace(REPLICA_PLACEHOLDER, str(r)))) for r in range(REPLICAS)]


def owners(counters: list[StageCounters], request_id: str) -> list[int]:
    """The replicas whose stage opened a stream for `request_id` (the engine's key is `<id>-<hex>`)."""
    return [
        r
        for r, c in enumerate(counters)
        if any(k == request_id or k.startswith(f"{request_id}-") for k in c["noise_seeds"])
    ]


def _sampling(max_tokens: int) -> list[Any]:
    from vllm import SamplingParams

    producer = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    return [producer, SamplingParams(max_tokens=1, detokenize=False)]


def test_streams_spread_over_two_replicas_each_whole_and_equal_to_the_stage_alone(
    replica_engine: OfflineEngine,
) -> None:
    engine = replica_engine
    prompts = {f"rep{i}": [41 + 5 * i, 52 + i, 63 + 2 * i, 70, 81 + i] for i in range(len(LENGTHS))}
    counts = dict(zip(prompts, LENGTHS, strict=True))
    requests = {rid: ({"prompt_token_ids": prompt}, _sampling(counts[rid])) for rid, prompt in prompts.items()}

    outcomes = engine.run(requests)

    counters = replica_counters(engine)
    pids = {c["pid"] for c in counters}
    assert len(pids) == REPLICAS, f"the replicas' counters come from {pids}: expected {REPLICAS} worker processes"
    for c in counters:
        assert c["errors"] == 0 and c["live_streams"] == 0, c.raw
    served_by = {rid: owners(counters, rid) for rid in prompts}
    assert all(len(r) == 1 for r in served_by.values()), f"each request must be served by one replica: {served_by}"
    per_replica = [sum(r == [i] for r in served_by.values()) for i in range(REPLICAS)]
    assert all(n >= 1 for n in per_replica), f"requests per replica {per_replica}: not spread ({served_by})"

    reference = reference_stage(FAMILY, engine.model, async_chunk=True)
    for rid, prompt in prompts.items():
        final = outcomes[rid].final
        assert outcomes[rid].sample_rate == 24000
        assert final.shape == (SAMPLES_PER_TOKEN * counts[rid],), rid
        for partial in outcomes[rid].audio[:-1]:  # each output is the audio so far
            assert max_abs(partial, final[: partial.shape[0]]) == 0.0, rid
        owner = counters[served_by[rid][0]]
        chunks = upstream_chunks(FAMILY, rid, prompt, counts[rid])
        # every chunk of the request reached the replica holding its stream, in order, the last one last
        assert owner.chunks(rid) == [(new_tokens(c), c.last) for c in chunks], (rid, served_by[rid])
        want = streamed_request(reference, chunks, owner.seed(rid))
        assert max_abs(final, want) <= TOLERANCE, rid
