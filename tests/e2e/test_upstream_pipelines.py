# SPDX-License-Identifier: Apache-2.0
"""Upstream's own Step-Audio2 and MiniCPM-o pipelines end to end at toy size, our code2wav behind them.

Each engine is built from upstream's own deploy YAML (`standin/toy/__init__.py` lists the only keys the
overlay changes) over a toy folder (`standin/toy/`): upstream's thinker (and MiniCPM-o's talker) with random
weights, a generated tokenizer, the stand-in token2wav assets. Text in, audio out through `AsyncOmni`, three
requests at once:

- Step-Audio2, `step_audio_2_async_chunk.yaml` (streamed): the thinker may sample codec ids only, so a reply of
  `max_tokens` tokens is that many codes; each request's stage-0 output (its token ids) is replayed through
  upstream's `thinker2token2wav_async_chunk` here: the payloads the same function returned in the engine
  (recorded, as for MiniCPM-o below) must be those, the code2wav stage must have served exactly those chunks
  (its counters), and the request's audio must equal those chunks through our stage alone in this process
  (<= 1e-5, the seed the engine's stage used). A request whose prompt exceeds the thinker's context fails
  alone (upstream's pipeline carries no per-request voice to the code2wav stage, so nothing else a request
  says can be invalid there).
- Step-Audio2, `step_audio_2.yaml` (whole): `thinker2token2wav` hands the whole reply over; the stage served
  one whole utterance of the reply's codes and the audio equals that utterance through our stage alone.
- MiniCPM-o 4.5, `minicpmo_4_5_turn.yaml`: the talker's codes travel through its multimodal-output hook and
  `tts2code2wav_async_chunk` (which the stand-in producer cannot emulate). They never reach the client, so
  the engine processes start with the toy recorder (`standin/toy/recorder.py`: a `sitecustomize` on their
  PYTHONPATH wraps upstream's async-chunk functions and writes each payload to a file): what upstream's
  function returned in the engine must be what the same function returns in-process for those codes (3
  silence codes + 25 new, then 3 context + 25, the rest last; the talker voices `max_tokens` - 1 codes), the
  stage must have served exactly those chunks (its counters), and the audio is 960 samples per code voiced.
  A request with a reference voice outside [-1, 1] (the chat server's `_minicpmo45_reference_audio`,
  forwarded by upstream's `llm2tts`) fails in our stage alone; a request with a valid reference voice gets
  audio.

With `VLLM_OMNI_TOKEN2WAV_OVERRIDES=0` the same deployments run upstream's code2wav classes
(`advanced_model`: minutes more, upstream's full-size speech tokenizer and HiFT): every request gets audio,
and our stage's counters file is never written; MiniCPM-o's replies have the length ours have (the talker's
codes do not depend on the code2wav class). Upstream's Step-Audio2 class puts no `sr` in its streamed outputs.

One engine at a time (module-scoped, parametrized fixtures); wall times on the 2-core host are in the
docstring of each fixture.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.engines import SAMPLES_PER_TOKEN, OfflineEngine, Outcome
from tests.e2e.references import (
    max_abs,
    minicpmo_talker_chunks,
    reference_stage,
    replay_chunks,
    streamed_request,
    whole_request,
)
from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.cpu, pytest.mark.engine]

require_engine("upstream's toy pipelines in the real engine")

TOLERANCE = 1e-5
REQUEST_TIMEOUT_S = 400.0
#: Step-Audio2 reply lengths (codes): a remainder, an exact chunk boundary, a short one.
SA2_CODES = {"a": 60, "b": 50, "c": 33}
#: MiniCPM-o talker reply lengths (steps; the talker voices one code fewer, pinned by the chunk check).
MINICPMO_STEPS = {"a": 60, "b": 53, "c": 40}


@dataclass
class Toy:
    family: str
    async_chunk: bool
    pipeline: Any
    model: Path
    engine: OfflineEngine
    upstream: bool
    records: Path  # what upstream's async-chunk function handed the code2wav stage (`standin/toy/recorder.py`)

    def recorded(self, request_id: str) -> list[tuple[tuple[int, ...], bool]]:
        """`[(codes, last)]` upstream's async-chunk function returned in the engine for the request."""
        from vllm_omni_token2wav.model_executor.models.standin.toy.recorder import read_records

        records = read_records(self.records)
        keys = [k for k in records if k == request_id or k.startswith(f"{request_id}-")]
        assert len(keys) == 1, (request_id, sorted(records))
        return [(tuple(r["codes"]), bool(r["last"])) for r in records[keys[0]]]


def _start(family: str, async_chunk: bool, tmp: Path, *, upstream: bool) -> Toy:
    from vllm_omni_token2wav.benchmarks.engine_ab.run import UPSTREAM_PATH, arm_environment
    from vllm_omni_token2wav.model_executor.models.standin.toy import TOY_PIPELINES, recorder, site_pythonpath

    pipeline = TOY_PIPELINES[family]
    model = pipeline.ensure_model_dir()
    deploy = pipeline.deployment(model, tmp, async_chunk=async_chunk)
    records = tmp / "chunks"
    records.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        for key, value in arm_environment("0" if upstream else "1").items():
            patch.setenv(key, value)  # the engine's processes, spawned now, inherit it
        # the recorder's sitecustomize runs at each engine process's start (PYTHONPATH, read at start-up)
        patch.setenv("PYTHONPATH", site_pythonpath(os.environ.get("PYTHONPATH")))
        patch.setenv(recorder.RECORD_ENV, str(records))
        if upstream:  # multiprocessing's spawn hands children this process's sys.path, not PYTHONPATH's
            patch.syspath_prepend(str(UPSTREAM_PATH))
        started = time.monotonic()
        engine = OfflineEngine(model, deploy, tmp / "stage_stats.json")
    print(f"{family} async_chunk={async_chunk} upstream={upstream}: ready in {time.monotonic() - started:.0f} s")
    return Toy(family, async_chunk, pipeline, model, engine, upstream, records)


OURS = [
    pytest.param(("step_audio2", True), id="step_audio2-async_chunk", marks=pytest.mark.core_model),
    pytest.param(("step_audio2", False), id="step_audio2-sync", marks=pytest.mark.core_model),
    pytest.param(("minicpmo_4_5", True), id="minicpmo_4_5-turn", marks=pytest.mark.core_model),
]


@pytest.fixture(scope="module", params=OURS)
def toy(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Toy]:
    """One toy pipeline with our code2wav (ready in 60-170 s on the 2-core host; its requests take 5-10 s)."""
    family, async_chunk = request.param
    built = _start(family, async_chunk, tmp_path_factory.mktemp(f"toy_{family}"), upstream=False)
    try:
        yield built
    finally:
        built.engine.close()


def _lengths(toy: Toy, prefix: str) -> dict[str, int]:
    """Request id -> reply length; each test has its own ids (the stage's counters key requests by id prefix)."""
    lengths = SA2_CODES if toy.family == "step_audio2" else MINICPMO_STEPS
    return {f"{prefix}{rid}": n for rid, n in lengths.items()}


def _requests(toy: Toy, prefix: str, voices: Mapping[str, Any] | None = None) -> dict[str, tuple[dict, list]]:
    voices = voices or {}
    return {
        rid: toy.pipeline.offline_prompt(
            f"Request {rid}: say something.", codes=n, seed=i, async_chunk=toy.async_chunk, voice=voices.get(rid)
        )
        for i, (rid, n) in enumerate(_lengths(toy, prefix).items())
    }


def _audio_ok(outcome: Outcome, samples: int) -> np.ndarray:
    final = outcome.final
    assert outcome.sample_rate == 24000 and outcome.outputs_without_sr == 0, outcome.request_id
    assert final.shape == (samples,), (outcome.request_id, final.shape, samples)
    assert np.isfinite(final).all() and np.abs(final).max() > 0, outcome.request_id
    for partial in outcome.audio[:-1]:  # each output is the audio so far
        assert max_abs(partial, final[: partial.shape[0]]) == 0.0, outcome.request_id
    return final


def _sine(rate: int, seconds: float, amplitude: float) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (amplitude * np.sin(2 * np.pi * 220.0 * t)).astype(np.float32)


def _check_step_audio2(toy: Toy, outcomes: Mapping[str, Outcome], lengths: Mapping[str, int]) -> None:
    from vllm_omni_token2wav.model_executor.models.standin.toy.step_audio2 import AUDIO_START

    counters = toy.engine.counters()
    reference = reference_stage("step_audio2", toy.model, async_chunk=toy.async_chunk, max_rows=1)
    for rid, n in lengths.items():
        outcome = outcomes[rid]
        generated = outcome.text_token_ids
        assert len(generated) == n and all(t >= AUDIO_START for t in generated), rid
        final = _audio_ok(outcome, n * SAMPLES_PER_TOKEN)
        if toy.async_chunk:
            chunks = replay_chunks("step_audio2", rid, [], generated)
            assert toy.recorded(rid) == [(c.tokens, c.last) for c in chunks], rid  # in the engine == in-process
            assert counters.chunks(rid) == [(len(c.tokens), c.last) for c in chunks], rid
            want = streamed_request(reference, chunks, counters.seed(rid))
        else:
            codes = [t - AUDIO_START for t in generated]
            assert counters.chunks(rid) == [(len(codes), True)], rid
            key = counters.key(rid)
            want = whole_request(reference, key, codes, {"seed": counters.seed(rid)})
        assert max_abs(final, want) <= TOLERANCE, rid


@pytest.mark.core_model
def test_concurrent_text_requests_get_the_audio_the_code2wav_stage_made_of_upstreams_chunks(toy: Toy) -> None:
    started = time.monotonic()
    outcomes = toy.engine.run(_requests(toy, "ok-"), timeout_s=REQUEST_TIMEOUT_S)
    print(f"{toy.family} async_chunk={toy.async_chunk}: 3 concurrent requests in {time.monotonic() - started:.1f} s")
    for outcome in outcomes.values():
        assert outcome.error is None, (outcome.request_id, outcome.error)
        assert outcome.text_outputs >= 1  # the thinker's text output reached the client too
    if toy.family == "step_audio2":
        _check_step_audio2(toy, outcomes, _lengths(toy, "ok-"))
        return
    counters = toy.engine.counters()
    for rid, steps in _lengths(toy, "ok-").items():
        recorded = toy.recorded(rid)  # the talker's codes, as upstream's tts2code2wav_async_chunk cut them
        codes = [c for tokens, _ in recorded for c in tokens[3:]]  # each chunk: 3 context codes + new ones
        assert len(codes) == steps - 1, rid  # the talker voices one code fewer than its steps
        assert recorded == minicpmo_talker_chunks(rid, codes), rid  # in the engine == in-process, code for code
        assert counters.chunks(rid) == [(len(tokens), last) for tokens, last in recorded], rid
        _audio_ok(outcomes[rid], (len(codes) + 3) * SAMPLES_PER_TOKEN)  # the 3 leading silence codes are voiced
    assert counters["live_streams"] == 0, counters.raw


@pytest.mark.core_model
def test_one_bad_request_fails_alone_and_the_others_get_audio(toy: Toy) -> None:
    if toy.family == "step_audio2":
        bad = "bad-b"
        requests = _requests(toy, "bad-")
        prompt, params = requests[bad]
        requests[bad] = ({"prompt": prompt["prompt"] + "x" * 5000}, params)  # > the thinker's 4096 positions
        expected = "maximum context length is 4096 tokens"
    else:
        bad = "bad-c"
        voices = {"bad-a": (_sine(16000, 2.0, 0.3), 16000), bad: (_sine(16000, 2.0, 1.5), 16000)}
        requests = _requests(toy, "bad-", voices)
        expected = "outside [-1, 1]"
    before = toy.engine.counters()["errors"]
    outcomes = toy.engine.run(requests, timeout_s=REQUEST_TIMEOUT_S)
    assert outcomes[bad].error is not None and expected in str(outcomes[bad].error), outcomes[bad].error
    good = [rid for rid in requests if rid != bad]
    for rid in good:
        assert outcomes[rid].error is None, (rid, outcomes[rid].error)
    if toy.family == "step_audio2":
        _check_step_audio2(toy, outcomes, {rid: n for rid, n in _lengths(toy, "bad-").items() if rid != bad})
    else:
        counters = toy.engine.counters()
        assert counters["errors"] == before + 1 and "outside [-1, 1]" in counters["last_error"], counters.raw
        for rid in good:
            assert outcomes[rid].final.shape[0] > 0
    again = toy.engine.run({"after": requests[good[0]]}, timeout_s=REQUEST_TIMEOUT_S)["after"]
    assert again.error is None and again.final.shape == outcomes[good[0]].final.shape  # the engine still serves


UPSTREAM = [
    pytest.param(("step_audio2", True), id="step_audio2-async_chunk"),
    pytest.param(("minicpmo_4_5", True), id="minicpmo_4_5-turn"),
]


@pytest.fixture(scope="module", params=UPSTREAM)
def upstream_toy(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Toy]:
    """The same toy deployment with upstream's code2wav classes (`VLLM_OMNI_TOKEN2WAV_OVERRIDES=0`)."""
    pytest.importorskip("librosa", reason="upstream's Step-Audio2 / MiniCPM-o code2wav imports librosa")
    family, async_chunk = request.param
    built = _start(family, async_chunk, tmp_path_factory.mktemp(f"upstream_{family}"), upstream=True)
    try:
        yield built
    finally:
        built.engine.close()


@pytest.mark.advanced_model
@pytest.mark.slow
def test_the_same_deployment_runs_upstreams_code2wav_classes_with_overrides_off(upstream_toy: Toy) -> None:
    outcomes = upstream_toy.engine.run(_requests(upstream_toy, "up-"), timeout_s=REQUEST_TIMEOUT_S)
    assert not upstream_toy.engine.stats_path.exists(), "our code2wav class served: the overrides switch was ignored"
    assert os.environ.get("VLLM_OMNI_TOKEN2WAV_OVERRIDES") is None  # only the engine's processes had it
    lengths = _lengths(upstream_toy, "up-")
    for rid, outcome in outcomes.items():
        assert outcome.error is None, (rid, outcome.error)
        assert outcome.final.shape[0] > 0 and np.isfinite(outcome.final).all(), rid
        if upstream_toy.family == "minicpmo_4_5":
            assert outcome.sample_rate == 24000, rid
            # the talker's codes do not depend on the code2wav class: upstream's voices as many samples as ours
            want = minicpmo_talker_chunks(rid, [0] * (lengths[rid] - 1))
            voiced = sum(len(tokens) for tokens, _ in want) - 3 * (len(want) - 1)
            assert outcome.final.shape == (voiced * SAMPLES_PER_TOKEN,), rid
        else:  # upstream's Step-Audio2 class puts no `sr` in its streamed outputs (serving assumes 24 kHz)
            assert outcome.sample_rate in (None, 24000), rid
        print(
            f"{upstream_toy.family} {rid}: {outcome.final.shape[0]} samples in {len(outcome.audio)} outputs "
            f"({outcome.outputs_without_sr} without `sr`)"
        )
