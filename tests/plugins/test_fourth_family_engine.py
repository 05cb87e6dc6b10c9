# SPDX-License-Identifier: Apache-2.0
"""A fourth family, added as its folder and one list line, served ALONE by the real vLLM-Omni engine.

The toy family (`tests/plugins/toy_family/`: a `family.py` record and a stage class on the shared core,
under its own architecture `ToyToken2WavModel`) joins the family list through
`VLLM_OMNI_TOKEN2WAV_EXTRA_FAMILIES`, which every engine process reads when the plugin loads. Nothing else
is written for it: the plugin registers its class and its `toy_token2wav_code2wav` pipeline, and the
stand-in folder is laid out from its `StandinLayout`. The deployment is Step-Audio2's code2wav YAML with the
toy's pipeline (an overlay). Two concurrent requests (the family's default voice, and a voice sent with the
request) must each come out equal to the same tokens through the shared core's facade (`Token2WavCore`)
in this process, with the voice normalised as the stage normalises every voice (<= 1e-5, equal length), and
the stage's counters must name the toy family (our class, not another, served it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the fourth-family engine test")

REPO_ROOT = Path(__file__).resolve().parents[2]
TOY_MODULE = "tests.plugins.toy_family.family"
TOLERANCE = 1e-5
N_TIMESTEPS = 2


def _deployment(folder: Path) -> Path:
    """Step-Audio2's shipped code2wav YAML as the base, the toy's pipeline and 2 Euler steps over it."""
    from vllm_omni_token2wav.deploy import deploy_config

    path = folder / "toy_token2wav_code2wav.yaml"
    path.write_text(
        f"base_config: {deploy_config('step_audio2_code2wav')}\n"
        "pipeline: toy_token2wav_code2wav\n"
        "stages:\n"
        "  - stage_id: 0\n"
        "    additional_config:\n"
        f"      token2wav_n_timesteps: {N_TIMESTEPS}\n"
    )
    return path


@pytest.fixture(scope="module")
def toy_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    from vllm_omni_token2wav import envs

    saved = {name: os.environ.get(name) for name in (envs.EXTRA_FAMILIES_ENV, "PYTHONPATH")}
    os.environ[envs.EXTRA_FAMILIES_ENV] = TOY_MODULE  # the one list line, for this process and the engine's
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), saved["PYTHONPATH"]) if p)
    engine = None
    try:
        from tests.e2e.engines import OfflineEngine
        from vllm_omni_token2wav.model_executor.models.standin.model_dirs import ensure_engine_model_dir
        from vllm_omni_token2wav.plugins import load_plugins
        from vllm_omni_token2wav.plugins.pipelines import register_pipelines

        load_plugins()
        assert "toy_token2wav_code2wav" in register_pipelines()  # also when another test registered first
        model = ensure_engine_model_dir("toy_token2wav")
        tmp = tmp_path_factory.mktemp("toy_family")
        started = time.monotonic()
        engine = OfflineEngine(model, _deployment(tmp), tmp / "stage_stats.json")
        print(f"toy family engine started in {time.monotonic() - started:.1f} s")
        yield model, engine
    finally:
        if engine is not None:
            engine.close()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _reference(model: Path, codes: list[int], voice: Any, seed: int) -> np.ndarray:
    """The same tokens through the shared core's facade, in this process (no stage, no engine)."""
    from tests.helpers.torch_state import one_intra_op_thread
    from vllm_omni_token2wav.model_executor.models.token2wav_core.core import Token2WavCore
    from vllm_omni_token2wav.model_executor.models.token2wav_stage.voice import (
        DEFAULT_REFERENCE_SECONDS,
        VOICE_SAMPLE_RATE,
        normalize_reference,
    )

    core = Token2WavCore(model / "token2wav", device="cpu", n_timesteps=N_TIMESTEPS)
    wav = normalize_reference(voice, DEFAULT_REFERENCE_SECONDS)  # what the stage does to every voice
    with one_intra_op_thread():
        return core(codes, (wav, VOICE_SAMPLE_RATE), seed=seed).reshape(-1).numpy()


def test_the_toy_family_is_served_alone_by_the_engine_and_equals_the_core(toy_engine: tuple[Path, Any]) -> None:
    from vllm_omni_token2wav.assets.audio import speech_sample

    model, engine = toy_engine
    rng = np.random.default_rng(31)
    clip, rate = speech_sample()
    voice = (clip[: int(1.6 * rate)], rate)
    requests = {
        "toy0": {"prompt_token_ids": rng.integers(0, 6561, 37).tolist(), "additional_information": {"seed": 11}},
        "toy1": {
            "prompt_token_ids": rng.integers(0, 6561, 52).tolist(),
            "additional_information": {"seed": 12, "ref_audio": voice[0].tolist(), "ref_audio_sr": rate},
        },
    }
    started = time.monotonic()
    outcomes = engine.run({rid: (prompt, None) for rid, prompt in requests.items()})
    print(f"toy family: 2 concurrent requests in {time.monotonic() - started:.1f} s")

    counters = engine.counters()
    assert counters["family"] == "toy_token2wav", counters.raw
    assert counters["errors"] == 0, counters.raw
    default_voice = str(model / "token2wav" / "default_female.wav")
    for rid, prompt in requests.items():
        info = prompt["additional_information"]
        got = outcomes[rid].final
        assert outcomes[rid].sample_rate == 24000, rid
        want = _reference(
            model, prompt["prompt_token_ids"], voice if "ref_audio" in info else default_voice, info["seed"]
        )
        assert got.shape == want.shape == (960 * len(prompt["prompt_token_ids"]),), rid
        assert float(np.abs(got - want).max()) <= TOLERANCE, rid
        assert float(np.abs(want).max()) > 0, rid  # audio, not silence
