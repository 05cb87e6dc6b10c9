# SPDX-License-Identifier: Apache-2.0
"""The Step-Audio2 Token2Wav stage model: config resolution, laziness, load_weights, forward, dtype."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.helpers.token2wav import SessionCounter
from vllm_omni.model_executor.models.step_audio2.step_audio2_token2wav_stage import (
    StepAudio2Token2WavForConditionalGeneration,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]


def _vllm_config(**hf: object) -> SimpleNamespace:
    return SimpleNamespace(
        model_config=SimpleNamespace(model="/nowhere/Step-Audio-2-mini", hf_config=SimpleNamespace(**hf)),
        device_config=SimpleNamespace(device=torch.device("cpu")),
    )


def _loaded(stage: StepAudio2Token2WavForConditionalGeneration) -> bool:
    core = stage.token2wav
    return any(m is not None for m in (core._flow, core._hift, core._tokenizer))


def test_construction_validates_the_directory_and_loads_nothing(
    token2wav_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = SessionCounter(monkeypatch)
    stage = StepAudio2Token2WavForConditionalGeneration(vllm_config=_vllm_config(token2wav_path=str(token2wav_dir)))
    assert stage.token2wav.model_path == token2wav_dir and stage.token2wav.device == torch.device("cpu")
    assert not _loaded(stage) and counter.count == 0 and stage.token2wav.spk_backend == "onnxruntime-cpu"
    assert list(stage.parameters()) == []  # no weights owned before load_weights


def test_asset_directory_resolution_order(tmp_path: Path, token2wav_dir: Path) -> None:
    model_dir = tmp_path / "Step-Audio-2-mini"
    (model_dir / "token2wav").mkdir(parents=True)
    no_hint = SimpleNamespace(model_config=SimpleNamespace(model=str(model_dir), hf_config=None))
    with pytest.raises(FileNotFoundError, match=r"token2wav/campplus\.onnx is missing"):
        StepAudio2Token2WavForConditionalGeneration(vllm_config=no_hint)
    explicit = StepAudio2Token2WavForConditionalGeneration(
        vllm_config=_vllm_config(token2wav_path="/wrong"), model_path=token2wav_dir
    )
    assert explicit.token2wav.model_path == token2wav_dir
    with pytest.raises(ValueError, match="needs model_path="):
        StepAudio2Token2WavForConditionalGeneration()


def test_load_weights_drains_the_iterable_and_loads_the_models(token2wav_dir: Path) -> None:
    stage = StepAudio2Token2WavForConditionalGeneration(model_path=token2wav_dir, device="cpu")
    seen = []
    weights = ((f"w{i}", torch.zeros(1)) for i in range(3) if not seen.append(i))
    assert stage.load_weights(weights) == set()
    assert seen == [0, 1, 2] and _loaded(stage)


def test_forward_returns_the_cores_audio_as_multimodal_output(
    token2wav_dir: Path, short_speech: tuple[np.ndarray, int]
) -> None:
    stage = StepAudio2Token2WavForConditionalGeneration(
        model_path=token2wav_dir, device="cpu", n_timesteps=2, prompt_wav=short_speech
    )
    ids = torch.tensor([5, 17, 300, 6560, 0, 42, 4218], dtype=torch.int64)  # short and with zeros: still real audio
    out = stage(ids, torch.arange(ids.numel()))
    audio = out.multimodal_outputs["model_outputs"]
    assert audio.shape == (7 * 960,) and audio.dtype == torch.float32 and out.text_hidden_states is None
    assert torch.equal(audio, stage.token2wav(ids.tolist(), short_speech)[0])
    assert stage(ids.reshape(1, -1), None).multimodal_outputs["model_outputs"].shape == (7 * 960,)
    dummy = stage(torch.zeros(64, dtype=torch.int64), None, dummy_run=True).multimodal_outputs["model_outputs"]
    assert dummy.numel() == 0


def test_forward_without_any_prompt_is_a_clear_error(token2wav_dir: Path) -> None:
    stage = StepAudio2Token2WavForConditionalGeneration(model_path=token2wav_dir, device="cpu")
    with pytest.raises(ValueError, match="no prompt_wav for this request"):
        stage(torch.tensor([1, 2, 3]))


def test_bf16_default_dtype_construction_and_synthesis_stay_fp32(
    token2wav_dir: Path, short_speech: tuple[np.ndarray, int]
) -> None:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # as vLLM's set_default_torch_dtype around model init
    try:
        stage = StepAudio2Token2WavForConditionalGeneration(
            model_path=token2wav_dir, device="cpu", n_timesteps=2, prompt_wav=short_speech
        )
        assert not _loaded(stage)
        stage.load_weights([])
        audio = stage(torch.tensor([1, 2, 3, 4])).multimodal_outputs["model_outputs"]
        assert torch.get_default_dtype() == torch.bfloat16
    finally:
        torch.set_default_dtype(previous)
    core = stage.token2wav
    dtypes = {p.dtype for m in (core.flow, core.hift) for p in m.parameters()}
    assert dtypes == {torch.float32} and audio.dtype == torch.float32 and bool(torch.isfinite(audio).all())
