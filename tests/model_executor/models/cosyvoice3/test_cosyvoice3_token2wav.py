# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3 Token2Wav facade: CosyVoice3 file names, same laziness and device switch as the core."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.token2wav import SessionCounter, assert_embeddings_close, make_token2wav_dir
from vllm_omni.assets.audio import speech_sample
from vllm_omni.model_executor.models.cosyvoice3 import speaker_embedding
from vllm_omni.model_executor.models.cosyvoice3.cosyvoice3_token2wav import COSYVOICE3_ASSETS, CosyVoice3Token2Wav

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]


@pytest.fixture(scope="module")
def cosyvoice3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_token2wav_dir(
        tmp_path_factory.mktemp("cosyvoice3"), files=("speech_tokenizer_v3.onnx", "flow.pt", "hift.pt")
    )


def test_cosyvoice3_asset_names() -> None:
    assert COSYVOICE3_ASSETS.speaker_model == "campplus.onnx"
    assert COSYVOICE3_ASSETS.speech_tokenizer == "speech_tokenizer_v3.onnx"
    assert COSYVOICE3_ASSETS.flow_config is None  # CosyVoice3 keeps it in cosyvoice3.yaml
    assert CosyVoice3Token2Wav.assets is COSYVOICE3_ASSETS


def test_device_switch_is_lazy_and_embeds_on_the_torch_path(
    cosyvoice3_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(speaker_embedding, "CPU_DEVICE_PATH_BACKEND", "torch")
    counter = SessionCounter(monkeypatch)
    facade = CosyVoice3Token2Wav(cosyvoice3_dir)
    assert facade.enable_device_spk_embedding().startswith("torch-cpu")
    facade._ensure_models_loaded()
    wav, rate = speech_sample()
    features = facade.prepare_prompt((wav[:rate], rate))
    assert features.speaker_embedding.shape == (1, 192) and features.backend.startswith("torch-cpu")
    assert counter.count == 0


def test_fallback_embedding_matches_onnxruntime_on_the_same_features(cosyvoice3_dir: Path) -> None:
    import onnxruntime

    from vllm_omni.model_executor.models import audio as frontend

    wav, rate = speech_sample()
    wav = wav[: 2 * rate].copy()
    features = frontend.speaker_features(torch.from_numpy(frontend.load_audio((wav, rate), 16000).numpy()))
    session = onnxruntime.InferenceSession(str(cosyvoice3_dir / "campplus.onnx"), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {session.get_inputs()[0].name: features[None].numpy()})
    got = CosyVoice3Token2Wav(cosyvoice3_dir).speaker_embedding((wav, rate))
    assert_embeddings_close(got, expected)


def test_missing_speaker_model_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "speech_tokenizer_v3.onnx").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"campplus\.onnx is missing"):
        CosyVoice3Token2Wav(tmp_path).enable_device_spk_embedding()
