# SPDX-License-Identifier: Apache-2.0
"""The code2wav stage's memory budget, driven by the real vLLM-Omni engine (`standin_cosyvoice3_stream.yaml`).

CosyVoice3's K/V grows with every frame, so the budget decides both when a stream may start and how far
it may grow (docs/design/token2wav_stage.md, "Memory budget"). The deployment's `additional_config`
sets `token2wav_stream_reserve_s` (each stream reserves its first chunk plus 6 s) and a
`token2wav_memory_budget` of 2.5 such reservations, computed before the engine starts from our stage
alone on the same stand-in model and voice: two streams fit at once.

- Three concurrent streamed requests (submitted shortest first): the third waits for memory and starts
  once the shortest ends; all three replies are whole and equal to the same chunks streamed through the
  stage alone (<= 1e-5), and the stage's counters show the wait.
- A reply too long to ever fit beside nothing (its K/V alone would exceed the budget) fails alone, with
  the message naming its length in tokens and the budget, while a request beside it gets its audio.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.engines import FAST_STAGE_OPTIONS, SAMPLES_PER_TOKEN, OfflineEngine, deployment
from tests.e2e.references import max_abs, new_tokens, reference_stage, streamed_request, upstream_chunks
from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the memory budget engine tests")

FAMILY = "cosyvoice3"
TOLERANCE = 1e-5
RESERVE_S = 6.0
#: Codes of the three concurrent requests, in submission order (the first two fit; the third waits).
LENGTHS = {"mbA": 60, "mbB": 100, "mbC": 150}
PROMPTS = {rid: [41 + 5 * i, 52 + i, 63, 74 + 2 * i, 85] for i, rid in enumerate(LENGTHS)}


def _sampling(max_tokens: int) -> list[Any]:
    from vllm import SamplingParams

    # ignore_eos: a code equal to the stand-in tokenizer's EOS id must not end the reply early (test_stream.py)
    producer = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    return [producer, SamplingParams(max_tokens=1, detokenize=False)]


@pytest.fixture(scope="module")
def budget_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OfflineEngine, Any, int, int]]:
    """(engine, reference stage, budget bytes, codes of a reply that can never fit)."""
    from vllm_omni_token2wav.model_executor.models.standin.model_dirs import ensure_engine_model_dir

    model = ensure_engine_model_dir(FAMILY)
    reference = reference_stage(FAMILY, model, async_chunk=True)
    # the voice the producer sends, as the stage reads it: the first chunk of a request through the reference
    first = upstream_chunks(FAMILY, "probe", PROMPTS["mbA"], LENGTHS["mbA"])
    streamed_request(reference, first[:1], seed=0)
    (state,) = reference.streams.states()
    estimate = reference.backend.estimate_stream_bytes
    reservation = estimate(state.voice, new_tokens(first[0]) + round(RESERVE_S * 25))
    budget = int(2.5 * reservation) + state.voice.prompt.nbytes
    reference.executor.finish([state.key])
    huge = next(n for n in range(200, 4000, 25) if estimate(state.voice, n) > 1.2 * budget)

    tmp = tmp_path_factory.mktemp("memory_budget")
    options = {**FAST_STAGE_OPTIONS, "token2wav_memory_budget": budget, "token2wav_stream_reserve_s": RESERVE_S}
    deploy = deployment(tmp, f"standin_{FAMILY}_stream", {1: {"additional_config": options}})
    engine = OfflineEngine(model, deploy, tmp / "stage_stats.json")
    try:
        yield engine, reference, budget, huge
    finally:
        engine.close()


def test_a_stream_over_the_budget_waits_and_every_reply_equals_its_request_alone(
    budget_engine: tuple[OfflineEngine, Any, int, int],
) -> None:
    engine, reference, budget, _ = budget_engine
    requests = {rid: ({"prompt_token_ids": PROMPTS[rid]}, _sampling(n)) for rid, n in LENGTHS.items()}

    outcomes = engine.run(requests, timeout_s=300.0)

    counters = engine.counters()
    assert counters["memory_budget_bytes"] == budget, counters.raw
    assert counters["budget_waits"] >= 1 and counters["budget_refusals"] == 0, counters.raw
    assert counters["errors"] == 0 and counters["live_streams"] == 0 and counters["waiting_streams"] == 0
    for rid, count in LENGTHS.items():
        final = outcomes[rid].final
        assert final.shape == (SAMPLES_PER_TOKEN * count,), rid
        chunks = upstream_chunks(FAMILY, rid, PROMPTS[rid], count)
        assert max_abs(final, streamed_request(reference, chunks, counters.seed(rid))) <= TOLERANCE, rid


def test_a_reply_that_can_never_fit_fails_alone_naming_its_length_and_the_budget(
    budget_engine: tuple[OfflineEngine, Any, int, int],
) -> None:
    engine, reference, budget, huge = budget_engine
    prompts = {"mbHuge": [90, 91, 92, 93, 94], "mbOk": PROMPTS["mbA"]}
    counts = {"mbHuge": huge, "mbOk": LENGTHS["mbA"]}
    requests = {rid: ({"prompt_token_ids": prompts[rid]}, _sampling(counts[rid])) for rid in prompts}

    outcomes = engine.run(requests, timeout_s=300.0)

    error = outcomes["mbHuge"].error
    assert isinstance(error, RuntimeError), outcomes["mbHuge"]
    text = str(error)
    assert text.startswith("request mbHuge-") and "its stream grew to" in text, text
    assert f"token2wav_memory_budget={budget} bytes" in text, text
    final = outcomes["mbOk"].final
    chunks = upstream_chunks(FAMILY, "mbOk", prompts["mbOk"], counts["mbOk"])
    assert max_abs(final, streamed_request(reference, chunks, engine.counters().seed("mbOk"))) <= TOLERANCE
    assert engine.counters()["budget_refusals"] >= 1
