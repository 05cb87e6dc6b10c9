# SPDX-License-Identifier: Apache-2.0
"""Streaming through a producer, driven by the real vLLM-Omni engine (`standin_<family>_stream.yaml`).

The stand-in producer (vLLM's AR scheduler, KV cache and sampler over a toy Qwen2 with forced logits)
emits a deterministic codec sequence per prompt (`standin.codes.expected_codes`), and upstream's own
async-chunk function of the family carries it to our code2wav stage through the shared-memory
connector: Step-Audio2 in windows of 25 + 3 lookahead tokens with the rest at the end, CosyVoice3 in
growing prefixes. Concurrent requests with different prompts and lengths (exact multiples of 25 and
remainders) share the stage's steps; each request's audio must equal the same codes chunked by the same
upstream function and streamed through our stage alone in this process (<= 1e-5), complete: 960
samples per code, also when the codes end exactly on a chunk boundary.

No seed reaches the stage on this path (its noise seed derives from the engine's request id), so the
reference takes the seed the engine's stage used from its counters, and checks the stage saw exactly
the chunks upstream's function cut.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.engines import FAST_STAGE_OPTIONS, SAMPLES_PER_TOKEN, OfflineEngine, deployment
from tests.e2e.references import max_abs, new_tokens, reference_stage, streamed_request, upstream_chunks
from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the streaming engine tests")

TOLERANCE = 1e-5
#: Codes per request: exact multiples of 25 (a chunk boundary at the end) and remainders, 2 to 6 chunks.
LENGTHS = (53, 75, 100, 140, 50, 78, 61)


@pytest.fixture(scope="module", params=("step_audio2", "cosyvoice3"))
def stream_engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Any]]:
    from vllm_omni_token2wav.model_executor.models.standin.model_dirs import ensure_engine_model_dir

    family = request.param
    tmp = tmp_path_factory.mktemp(f"stream_{family}")
    deploy = deployment(tmp, f"standin_{family}_stream", {1: {"additional_config": FAST_STAGE_OPTIONS}})
    engine = OfflineEngine(ensure_engine_model_dir(family), deploy, tmp / "stage_stats.json")
    try:
        yield family, engine
    finally:
        engine.close()


def _sampling(max_tokens: int) -> list[Any]:
    from vllm import SamplingParams

    # ignore_eos: CosyVoice3's codes are token ids below 6561, and the stand-in tokenizer's EOS (256) is one
    # of them; a code equal to it must not end the reply early (upstream's chunker keeps it as a code).
    producer = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    return [producer, SamplingParams(max_tokens=1, detokenize=False)]


def test_concurrent_streams_each_equal_their_chunks_streamed_through_the_stage_alone(
    stream_engine: tuple[str, Any],
) -> None:
    family, engine = stream_engine
    prompts = {f"{family[:4]}s{i}": [40 + 7 * i, 50 + i, 60 + 3 * i, 70, 80 + i] for i in range(len(LENGTHS))}
    counts = dict(zip(prompts, LENGTHS, strict=True))
    requests = {rid: ({"prompt_token_ids": prompt}, _sampling(counts[rid])) for rid, prompt in prompts.items()}

    outcomes = engine.run(requests)

    counters = engine.counters()
    assert counters["errors"] == 0 and counters["live_streams"] == 0, counters.raw
    assert counters["multi_request_steps"] >= 1, counters.raw
    reference = reference_stage(family, engine.model, async_chunk=True)
    streamed = 0
    for rid, prompt in prompts.items():
        final = outcomes[rid].final
        assert outcomes[rid].sample_rate == 24000
        # every code was voiced, also when the codes end on a chunk boundary (LENGTHS: 50, 75, 100)
        assert final.shape == (SAMPLES_PER_TOKEN * counts[rid],), rid
        for partial in outcomes[rid].audio[:-1]:  # each output is the audio so far
            assert max_abs(partial, final[: partial.shape[0]]) == 0.0, rid
        streamed += len(outcomes[rid].audio) > 1
        chunks = upstream_chunks(family, rid, prompt, counts[rid])
        assert counters.chunks(rid) == [(new_tokens(c), c.last) for c in chunks], rid
        want = streamed_request(reference, chunks, counters.seed(rid))
        assert max_abs(final, want) <= TOLERANCE, rid
    assert streamed >= 1  # audio arrived before the end of at least one reply
