# SPDX-License-Identifier: Apache-2.0
"""MiniCPM-o's minicpmo-utils 1.0.7 variant through the serving stage: selected by a stage option, each
request equal to the restated 1.0.7 driver, batched requests equal to each request alone (the causal
vocoder's per-request state in the stage's caches, rows at different positions sharing vocoder
launches), failures costing only the culprit, and a 0-token last chunk flushing the vocoder.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.fake_device_graphs import fake_graph_api
from tests.helpers.minicpmo_reference import LEADING_ZEROS, MiniCPMOReferenceStream
from tests.helpers.token2wav import make_token2wav_dir
from tests.model_executor.models.token2wav_stage.conftest import FAST_OPTIONS
from tests.model_executor.models.token2wav_stage.test_stage_batching import (
    _assert_equal_to_solo,
    _forward,
    _run_batched,
    _schedule,
    assert_a_failing_launch_costs_only_its_culprit,
)
from vllm_omni_token2wav.model_executor.layers.flow import ConformerTrim, Lookahead
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav import MiniCPMO45Code2Wav
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.variants import MiniCPMOVariant
from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import ProducerStream, all_chunks
from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import MINICPMO_1_0_7_LAYOUT
from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav_stage import (
    StepAudio2Token2WavForConditionalGeneration,
)
from vllm_omni_token2wav.model_executor.models.token2wav_core.causal_vocoder import CausalHiFTVocoder
from vllm_omni_token2wav.model_executor.models.token2wav_core.stream_vocoder import VocoderKind

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]

VARIANT = {"variant": "minicpmo-utils-1.0.7"}


@pytest.fixture(scope="module")
def model_107(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A MiniCPM-o model folder whose assets/token2wav is in the minicpmo-utils 1.0.7 layout."""
    root = tmp_path_factory.mktemp("model107")
    make_token2wav_dir(root / "assets" / "token2wav", synthesis=True, layout=MINICPMO_1_0_7_LAYOUT)
    return root


@pytest.fixture(scope="module")
def stages(model_107: Path) -> tuple[MiniCPMO45Code2Wav, MiniCPMO45Code2Wav]:
    """A stage for batched runs and another for solo runs (same weights, no shared state)."""
    return (
        MiniCPMO45Code2Wav(model=str(model_107), **FAST_OPTIONS, **VARIANT),
        MiniCPMO45Code2Wav(model=str(model_107), **FAST_OPTIONS, **VARIANT),
    )


def _emitted(chunks: list[Any]) -> int:
    return sum(len(c.tokens) - (0 if c.last else 3) for c in chunks)


def test_the_variant_is_a_stage_option_of_minicpmo_only(model_107: Path, model_dir: Path) -> None:
    config = SimpleNamespace(
        model_config=SimpleNamespace(
            model=str(model_107),
            hf_config=SimpleNamespace(),
            stage_connector_config={"extra": {"token2wav_variant": "minicpmo-utils-1.0.7"}},
        )
    )
    stage = MiniCPMO45Code2Wav(vllm_config=config)
    core = stage.token2wav
    assert stage.variant is MiniCPMOVariant.MINICPMO_UTILS_1_0_7
    assert (core.stream_lookahead, core.conformer_trim, core.vocoder_kind) == (
        Lookahead.PROMPT_HEAD,
        ConformerTrim.PER_RATE,
        VocoderKind.CAUSAL_HIFT,
    )
    assert MiniCPMO45Code2Wav(model=str(model_dir), **FAST_OPTIONS).variant is MiniCPMOVariant.VLLM_OMNI_0_30
    with pytest.raises(ValueError, match="unknown MiniCPM-o token2wav variant 'causal'"):
        MiniCPMO45Code2Wav(model=str(model_107), variant="causal")
    with pytest.raises(ValueError, match="step_audio2 has no token2wav variants"):
        StepAudio2Token2WavForConditionalGeneration(model=str(model_dir), **FAST_OPTIONS, **VARIANT)
    with pytest.raises(FileNotFoundError, match=r"config\.yaml is missing"):  # a vLLM-Omni layout folder
        MiniCPMO45Code2Wav(model=str(model_dir), **FAST_OPTIONS, **VARIANT)


def test_a_request_through_the_stage_equals_the_minicpmo_utils_driver(
    stages: tuple[MiniCPMO45Code2Wav, MiniCPMO45Code2Wav], model_107: Path, voices: list[tuple[np.ndarray, int]]
) -> None:
    stage = stages[1]
    tokens = torch.randint(0, 6561, (140,), generator=torch.Generator().manual_seed(11)).tolist()
    chunks = all_chunks(ProducerStream("one", tokens, stage.family, voice=voices[1]))
    features = stage.token2wav.prepare_prompt(stage._voice(voices[1]), with_tokens=True)
    driver = MiniCPMOReferenceStream(
        model_107 / "assets" / "token2wav", features, n_timesteps=FAST_OPTIONS["n_timesteps"]
    )
    for chunk in chunks:
        audio, errors = _forward(stage, [chunk])
        assert errors == [None], errors
        want = driver.stream(list(chunk.tokens), chunk.last).reshape(-1)
        assert audio[0].shape == want.shape
        torch.testing.assert_close(audio[0], want, rtol=0, atol=1e-6)
    assert driver.cache.conformer_frames == features.prompt_mel.shape[1] + 100  # trimmed streams were compared


def test_randomised_schedule_equals_each_request_alone_and_shares_vocoder_launches(
    stages: tuple[MiniCPMO45Code2Wav, MiniCPMO45Code2Wav],
    voices: list[tuple[np.ndarray, int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batched, solo = stages
    requests = _schedule(MiniCPMO45Code2Wav, voices, n=5, seed=7)
    launches: list[int] = []
    real = CausalHiFTVocoder.vocode

    def vocode(self, chunks, pad_rows=0, graphed=None):  # type: ignore[no-untyped-def]
        launches.append(len(chunks))
        return real(self, chunks, pad_rows, graphed)

    monkeypatch.setattr(CausalHiFTVocoder, "vocode", vocode)
    _run_batched(batched, requests, seed=8)
    monkeypatch.undo()
    assert batched.live_streams == 0 and max(launches) > 1  # streams at different positions shared launches
    _assert_equal_to_solo(requests, solo)
    for r in requests:  # 960 samples per emitted token, and 3840 zeros unless the whole reply was one chunk
        zeros = LEADING_ZEROS if len(r.chunks) > 1 else 0
        assert sum(a.numel() for a in r.audio) == 960 * _emitted(r.chunks) + zeros
        if zeros:
            first = torch.cat(r.audio)
            assert not first[:LEADING_ZEROS].any() and first[LEADING_ZEROS:].any()


def test_a_vocoder_failure_in_a_batched_launch_costs_only_the_culprit(
    stages: tuple[MiniCPMO45Code2Wav, MiniCPMO45Code2Wav],
    voices: list[tuple[np.ndarray, int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batched, solo = stages
    requests = _schedule(MiniCPMO45Code2Wav, voices, n=3, seed=9)
    assert_a_failing_launch_costs_only_its_culprit(
        "v-",
        batched,
        solo,
        requests,
        monkeypatch,
        method="run_vocoder",
        error="NPU error: aicore exception in the vocoder",
        seed=10,
    )


def test_a_zero_token_last_chunk_flushes_the_causal_vocoder(
    stages: tuple[MiniCPMO45Code2Wav, MiniCPMO45Code2Wav],
) -> None:
    stage = stages[1]
    tokens = random.Random(4).choices(range(6561), k=53)
    chunks = [c for c in all_chunks(ProducerStream("flush", tokens, stage.family)) if not c.last]
    pieces = []
    for chunk in chunks:
        audio, errors = _forward(stage, [chunk])
        assert errors == [None]
        pieces.append(audio[0])
    end = replace(chunks[-1], tokens=(), last=True, chunk_seq=len(chunks))
    audio, errors = _forward(stage, [end])
    assert errors == [None] and audio[0].numel() == 8 * 480  # the frames the causal vocoder held back
    assert sum(p.numel() for p in pieces) + audio[0].numel() == LEADING_ZEROS + 960 * _emitted(chunks)
    assert stage.streams.get("flush") is None


def test_with_device_graphs_the_estimator_replays_and_the_causal_vocoder_runs_eagerly(
    tmp_path: Path, voices: list[tuple[np.ndarray, int]]
) -> None:
    # No hift_original.pt: building the stage's graphs must not load the whole-utterance vocoder.
    make_token2wav_dir(tmp_path / "assets" / "token2wav", synthesis=True, layout=MINICPMO_1_0_7_LAYOUT)
    (tmp_path / "assets" / "token2wav" / "hift_original.pt").unlink()
    api, _ = fake_graph_api()
    options = {**FAST_OPTIONS, **VARIANT, "max_rows": 4}
    graphed = MiniCPMO45Code2Wav(model=str(tmp_path), **options, device_graphs=True, device_graph_api=api)
    eager = MiniCPMO45Code2Wav(model=str(tmp_path), **options, device_graphs=False, pad_to_buckets=True)
    for stage in (graphed, eager):
        stage.load_weights([])
    graphs = graphed.backend.graphs
    assert graphs is not None and graphs.active and graphs.hift is None
    got, want = (_schedule(MiniCPMO45Code2Wav, voices, n=3, seed=13) for _ in range(2))
    _run_batched(graphed, got, seed=14)
    _run_batched(eager, want, seed=14)
    for a, b in zip(got, want, strict=True):
        assert len(a.audio) == len(b.audio) and all(torch.equal(x, y) for x, y in zip(a.audio, b.audio, strict=True))
    summary = graphs.summary()
    assert summary["captures"] > 0 and summary["replays"] > 0 and summary["hift_keys"] == []
