# SPDX-License-Identifier: Apache-2.0
"""Each family's code2wav stage alone, driven by the real vLLM-Omni engine (`<family>_code2wav.yaml`).

Users who already have codec tokens run the stage with no producer: a request is the codec ids plus an
optional voice (docs/design/token2wav_stage.md, "Requests without a producer"). One `AsyncOmni` engine per
family (reduced stand-in, 2 Euler steps) gets requests of different lengths and voices at once; the
engine may put several into one step, and each must still get exactly the audio of the same tokens run
through our stage class in this process alone (<= 1e-5, equal length). The stage's own counters show
that steps really carried several requests. A request with an out-of-range code fails alone with an
error naming the token and its position, the others complete, and the engine keeps serving.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.engines import FAST_STAGE_OPTIONS, SAMPLES_PER_TOKEN, OfflineEngine, deployment
from tests.e2e.references import max_abs, reference_stage, whole_request
from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the code2wav-alone engine tests")

TOLERANCE = 1e-5
FAMILIES = ("minicpmo_4_5", "step_audio2", "cosyvoice3")


class Deployment:
    """One family's engine and its in-process reference stage."""

    def __init__(self, family: str, tmp: Path) -> None:
        from vllm_omni_token2wav.model_executor.models.standin.model_dirs import ensure_engine_model_dir

        self.family = family
        self.model = ensure_engine_model_dir(family)
        deploy = deployment(tmp, f"{family}_code2wav", {0: {"additional_config": FAST_STAGE_OPTIONS}})
        self.engine = OfflineEngine(self.model, deploy, tmp / "stage_stats.json")
        self._reference: Any = None

    def reference(self, request_id: str, prompt: dict[str, Any]) -> np.ndarray:
        if self._reference is None:
            self._reference = reference_stage(self.family, self.model, async_chunk=False)
        return whole_request(self._reference, request_id, prompt["prompt_token_ids"], prompt["additional_information"])


@pytest.fixture(scope="module", params=FAMILIES)
def family_engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    deployment_ = Deployment(request.param, tmp_path_factory.mktemp(f"code2wav_{request.param}"))
    try:
        yield deployment_
    finally:
        deployment_.engine.close()


def _voice(family: str, index: int, rng: np.random.Generator) -> dict[str, Any]:
    """A reference voice: 1.6 s of the shipped speech clip from a different place per request (16 kHz)."""
    from vllm_omni_token2wav.assets.audio import speech_sample

    wav, rate = speech_sample()
    start = int(0.45 * index * rate)
    voice: dict[str, Any] = {"ref_audio": wav[start : start + int(1.6 * rate)].tolist(), "ref_audio_sr": rate}
    if family == "cosyvoice3":  # its speech tokenizer v3 is not in-tree: the voice's tokens come with it
        voice["speech_token"] = rng.integers(0, 6561, 40).tolist()
    return voice


def _requests(family: str, lengths: list[int], *, seed: int, voices: bool = True) -> dict[str, dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = {}
    for i, n in enumerate(lengths):
        info: dict[str, Any] = {"seed": 1000 * seed + i}
        if voices and i % 3 != 0:  # every third request keeps the stage's default voice
            info |= _voice(family, i, rng)
        out[f"{family[:4]}{seed}r{i}"] = {
            "prompt_token_ids": rng.integers(0, 6561, n).tolist(),
            "additional_information": info,
        }
    return out


def _assert_each_equals_its_solo_run(
    deployment_: Deployment, requests: dict[str, dict[str, Any]], outcomes: dict
) -> None:
    for rid, prompt in requests.items():
        got = outcomes[rid].final
        assert outcomes[rid].sample_rate == 24000, rid
        want = deployment_.reference(rid, prompt)
        assert got.shape == want.shape == (SAMPLES_PER_TOKEN * len(prompt["prompt_token_ids"]),), rid
        assert max_abs(got, want) <= TOLERANCE, rid


def test_concurrent_requests_of_different_lengths_and_voices_each_equal_the_stage_run_alone(
    family_engine: Deployment,
) -> None:
    requests = _requests(family_engine.family, [23, 47, 64, 81, 30, 56], seed=1)
    outcomes = family_engine.engine.run({rid: (prompt, None) for rid, prompt in requests.items()})
    _assert_each_equals_its_solo_run(family_engine, requests, outcomes)
    counters = family_engine.engine.counters()
    assert counters["multi_request_steps"] >= 1, counters.raw
    assert counters["errors"] == 0 and counters["live_streams"] == 0, counters.raw
    for rid, prompt in requests.items():  # the seed each request sent is the one its noise used
        assert counters.seed(rid) == prompt["additional_information"]["seed"]
        assert counters.chunks(rid) == [(len(prompt["prompt_token_ids"]), True)]


@pytest.mark.parametrize("family_engine", ["step_audio2"], indirect=True)  # one family shows the engine's path
def test_an_out_of_range_code_fails_its_request_alone_and_the_engine_keeps_serving(
    family_engine: Deployment,
) -> None:
    good = _requests("step_audio2", [25, 31, 40, 52, 28, 36, 44], seed=2)
    bad_codes = list(range(100, 112))
    bad_codes[9] = 7000
    bad = {"prompt_token_ids": bad_codes, "additional_information": {"seed": 5}}
    requests = {**good, "sa2bad": bad}
    errors_before = family_engine.engine.counters()["errors"] if family_engine.engine.stats_path.exists() else 0

    outcomes = family_engine.engine.run({rid: (prompt, None) for rid, prompt in requests.items()})

    error = outcomes["sa2bad"].error
    assert isinstance(error, RuntimeError), outcomes["sa2bad"]
    assert "speech token 7000 at position 9 is outside [0, 6561)" in str(error), str(error)
    assert str(error).startswith("request sa2bad-"), str(error)
    _assert_each_equals_its_solo_run(family_engine, good, outcomes)
    assert family_engine.engine.counters()["errors"] == errors_before + 1
    after = _requests("step_audio2", [33, 27], seed=3)
    outcomes = family_engine.engine.run({rid: (prompt, None) for rid, prompt in after.items()})
    _assert_each_equals_its_solo_run(family_engine, after, outcomes)
