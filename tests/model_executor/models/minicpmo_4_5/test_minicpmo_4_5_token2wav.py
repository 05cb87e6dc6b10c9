# SPDX-License-Identifier: Apache-2.0
"""MiniCPM-o 4.5 Token2Wav facade and code2wav stage: device resolution, eager checks with lazy loading,
platform gating, dtype, and synthesis through MiniCPM-o's streaming variant."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.fake_npu import install_fake_torch_npu
from tests.helpers.token2wav import SessionCounter
from vllm_omni_token2wav import platforms
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav import MiniCPMO45Code2Wav
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_token2wav import (
    MiniCPMO45Token2wav,
    resolve_token2wav_device,
)
from vllm_omni_token2wav.model_executor.models.speaker_embedding import selection as speaker_embedding
from vllm_omni_token2wav.model_executor.models.token2wav_core.core import Token2WavCore
from vllm_omni_token2wav.platforms.cuda.platform import CudaDevicePlatform
from vllm_omni_token2wav.platforms.npu.platform import NpuDevicePlatform

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]


class _OneCudaPlatform(CudaDevicePlatform):
    """CUDA platform that answers without a GPU (device index 0)."""

    def current_device_index(self) -> int | None:
        return 0


@pytest.fixture
def enable_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record `enable_spk_embedding(request)` calls on the core (without building anything)."""
    calls: list[str] = []

    def record(self: Token2WavCore, request: str) -> str:
        calls.append(f"{request}:{self.device}")
        return "recorded"

    monkeypatch.setattr(Token2WavCore, "enable_spk_embedding", record)
    return calls


# ---- facade ------------------------------------------------------------------------------------


def test_device_resolution_explicit_then_platform() -> None:
    assert resolve_token2wav_device("cpu") == torch.device("cpu")
    assert resolve_token2wav_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_token2wav_device(None) == torch.device("cpu")
    platforms.reset_current_platform(_OneCudaPlatform())
    assert resolve_token2wav_device(None) == torch.device("cuda", 0)
    assert resolve_token2wav_device("cpu") == torch.device("cpu")  # explicit wins over the platform


def test_construction_checks_assets_but_loads_nothing(token2wav_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = SessionCounter(monkeypatch)
    facade = MiniCPMO45Token2wav(token2wav_dir, float16=True, n_timesteps=5)
    assert facade.device == torch.device("cpu")
    assert (facade.float16, facade.n_timesteps) == (True, 5)
    assert facade.spk_backend == "onnxruntime-cpu"
    assert counter.count == 0
    assert facade._flow is None and facade._hift is None and facade._tokenizer is None
    facade.load()
    assert facade._flow is not None and facade._flow.dtype == torch.float16 and counter.count == 0


def test_construction_errors_surface_at_init(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no-such-dir does not exist"):
        MiniCPMO45Token2wav(tmp_path / "no-such-dir")
    (tmp_path / "hift.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"campplus\.onnx is missing"):
        MiniCPMO45Token2wav(tmp_path)
    (tmp_path / "campplus.onnx").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"speech_tokenizer_v2_25hz\.onnx is missing"):
        MiniCPMO45Token2wav(tmp_path)
    with pytest.raises(ValueError, match="invalid device spec"):
        MiniCPMO45Token2wav(tmp_path, device="gpu")


def test_facade_prompt_path_matches_the_core_it_wraps(
    token2wav_dir: Path, short_speech: tuple[np.ndarray, int]
) -> None:
    from vllm_omni_token2wav.model_executor.models.token2wav_core.core import Token2WavCore

    facade = MiniCPMO45Token2wav(token2wav_dir)
    expected = Token2WavCore(token2wav_dir).prepare_prompt(short_speech)
    got = facade.prepare_prompt(short_speech)
    torch.testing.assert_close(got.speaker_embedding, expected.speaker_embedding, rtol=0, atol=0)
    torch.testing.assert_close(facade.speaker_embedding(short_speech), expected.speaker_embedding, rtol=0, atol=0)


def test_bf16_default_dtype_construction_builds_fp32_only(
    token2wav_dir: Path, monkeypatch: pytest.MonkeyPatch, short_speech: tuple[np.ndarray, int]
) -> None:
    speech = short_speech
    monkeypatch.setattr(speaker_embedding, "CPU_DEVICE_PATH_BACKEND", "torch")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        facade = MiniCPMO45Token2wav(token2wav_dir)
        facade.enable_device_spk_embedding()
        stage = MiniCPMO45Code2Wav(model=str(token2wav_dir), prompt_wav=speech)
        assert torch.get_default_dtype() == torch.bfloat16
        emb = facade.speaker_embedding(speech)
        assert torch.get_default_dtype() == torch.bfloat16
    finally:
        torch.set_default_dtype(previous)
    assert emb.dtype == torch.float32
    assert stage.reference is not None and stage.reference[0].dtype == np.float32


# ---- code2wav stage (its serving contract: tests/model_executor/models/token2wav_stage/) ---------


def test_stage_on_cpu_keeps_the_lazy_fallback(
    token2wav_dir: Path, monkeypatch: pytest.MonkeyPatch, enable_calls: list[str]
) -> None:
    counter = SessionCounter(monkeypatch)
    stage = MiniCPMO45Code2Wav(model=str(token2wav_dir))
    assert enable_calls == [] and stage.spk_backend == "onnxruntime-cpu" and counter.count == 0
    assert stage.default_voice == token2wav_dir / "HT_ref_audio.wav"
    features = stage.prompt_features()
    assert features.prompt_mel.shape == (1, 300, 80)  # the default voice normalised to 6 s of 24 kHz, 50 frames/s
    assert counter.count == 1


def test_stage_on_npu_enables_the_device_path(
    token2wav_dir: Path, monkeypatch: pytest.MonkeyPatch, enable_calls: list[str]
) -> None:
    install_fake_torch_npu(monkeypatch)
    platforms.reset_current_platform(NpuDevicePlatform())
    counter = SessionCounter(monkeypatch)
    MiniCPMO45Code2Wav(model=str(token2wav_dir), device="cpu")
    assert enable_calls == ["device:cpu"]
    assert counter.count == 0


def test_stage_on_npu_fails_when_the_device_path_fails(token2wav_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_torch_npu(monkeypatch)
    platforms.reset_current_platform(NpuDevicePlatform())

    def broken(self: Token2WavCore, request: str) -> str:
        raise RuntimeError("torch CAM++ cannot be placed on npu:0: device out of memory")

    monkeypatch.setattr(Token2WavCore, "enable_spk_embedding", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        MiniCPMO45Code2Wav(model=str(token2wav_dir), device="cpu")


def test_stage_prompt_features_of_a_given_voice_are_normalised_like_the_default(
    token2wav_dir: Path, short_speech: tuple[np.ndarray, int]
) -> None:
    stage = MiniCPMO45Code2Wav(model=str(token2wav_dir), reference_seconds=2.0)
    features = stage.prompt_features(short_speech)  # 1.5 s of speech, zero-padded to 2 s at 24 kHz
    assert features.speaker_embedding.shape == (1, 192) and features.prompt_mel.shape == (1, 100, 80)


def test_a_click_in_silence_is_not_a_voice_for_the_facade_or_the_stage(token2wav_dir: Path) -> None:
    click = np.zeros(16000, np.float32)
    click[8000] = 0.5
    facade = MiniCPMO45Token2wav(token2wav_dir, device="cpu")
    with pytest.raises(ValueError, match=r"<array>: prompt has 0\.03 s of sustained signal in its 1\.00 s"):
        facade.speaker_embedding((click, 16000))
    with pytest.raises(ValueError, match=r"0\.03 s of sustained signal in its 1\.00 s"):
        facade.set_stream_cache((click, 16000))
    # The stage's API uses the voice as it normalises it (24 kHz, zero-padded to 2 s here): still 0.03 s.
    stage = MiniCPMO45Code2Wav(model=str(token2wav_dir), reference_seconds=2.0, device="cpu")
    for call in (lambda: stage.prompt_features((click, 16000)), lambda: stage.start_stream((click, 16000))):
        with pytest.raises(ValueError, match=r"0\.0\d s of sustained signal in its 2\.00 s, below the 0\.3 s"):
            call()


# ---- synthesis ----------------------------------------------------------------------------------


def test_facade_streams_with_minicpmo_lookahead_and_trim_by_default(token2wav_dir: Path) -> None:
    from vllm_omni_token2wav.model_executor.layers.flow import ConformerTrim, Lookahead

    core = MiniCPMO45Token2wav(token2wav_dir)
    assert (core.stream_lookahead, core.conformer_trim) == (Lookahead.SILENCE, ConformerTrim.PROMPT_PLUS_TAIL)
    stage = MiniCPMO45Code2Wav(model=str(token2wav_dir))
    assert (stage.token2wav.stream_lookahead, stage.token2wav.conformer_trim) == (
        Lookahead.SILENCE,
        ConformerTrim.PROMPT_PLUS_TAIL,
    )


def test_code2wav_synthesizes_every_code_through_the_streaming_path(
    token2wav_dir: Path, speech: tuple[np.ndarray, int]
) -> None:
    from vllm_omni_token2wav.model_executor.models.token2wav_core.stream import stream_chunks

    stage = MiniCPMO45Code2Wav(model=str(token2wav_dir), prompt_wav=speech, reference_seconds=2.0, n_timesteps=2)
    codes = torch.randint(0, 6561, (61,), generator=torch.Generator().manual_seed(0)).tolist()
    audio = stage.synthesize(codes)
    assert audio.shape == (1, 61 * 960) and audio.dtype == torch.float32 and bool(torch.isfinite(audio).all())
    # The same request driven by hand through the core's stream API, with the stage's reference voice.
    core = stage.token2wav
    state = core.set_stream_cache(stage.reference)
    assert state.flow_cache.conformer_trim.value == "prompt_plus_tail"
    by_hand = [core.stream(c, None, last, True, state=state) for c, last in stream_chunks(codes)]
    assert torch.equal(torch.cat(by_hand, dim=1), audio)  # type: ignore[arg-type]
    request = stage.start_stream()
    first = stage.stream(request, codes[:28])
    assert torch.equal(first, by_hand[0])  # type: ignore[arg-type]
