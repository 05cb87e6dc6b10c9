# SPDX-License-Identifier: Apache-2.0
"""The English retry ladder of the transformers Whisper backend, on a real tiny Whisper (no hub).

Each test spies on `model.generate` (calling through to the real one) and checks which prompt arguments
each attempt carried, that `attention_mask` rode along every time, and which errors end the ladder.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from vllm_omni_token2wav.benchmarks.seed_tts.asr import hf_whisper
from vllm_omni_token2wav.benchmarks.seed_tts.asr.hf_whisper import HFWhisperBackend, check_asr_audio

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


class GenerateSpy:
    """Record the kwargs of every generate call (and whether it raised), then run the real generate."""

    def __init__(self, model: Any) -> None:
        self.real = model.generate
        self.calls: list[dict[str, Any]] = []

    def __call__(self, features: Any, **kwargs: Any) -> Any:
        record = {"frames": int(features.shape[-1]), "raised": None, **kwargs}
        self.calls.append(record)
        try:
            return self.real(features, **kwargs)
        except Exception as exc:
            record["raised"] = exc
            raise


def _audio(seconds: float) -> np.ndarray:
    rng = np.random.default_rng(1)
    return (0.05 * rng.standard_normal(int(seconds * 16000))).astype(np.float32)


def _backend(tiny_whisper: Any, monkeypatch: pytest.MonkeyPatch, config: Any) -> tuple[HFWhisperBackend, GenerateSpy]:
    model = tiny_whisper.model
    monkeypatch.setattr(model, "generation_config", copy.deepcopy(config))
    spy = GenerateSpy(model)
    monkeypatch.setattr(model, "generate", spy)
    backend = HFWhisperBackend(
        model=model,
        feature_extractor=tiny_whisper.feature_extractor,
        tokenizer=tiny_whisper.tokenizer,
        model_id="tiny-random-whisper",
    )
    return backend, spy


def _prompt_args(call: dict[str, Any]) -> str:
    if "generation_config" in call:
        return f"forced:{call['generation_config'].forced_decoder_ids}"
    if "language" in call:
        return f"{call['language']}/{call['task']}"
    return "bare"


def test_multilingual_checkpoint_succeeds_on_forced_decoder_ids(tiny_whisper: Any, monkeypatch: pytest.MonkeyPatch):
    backend, spy = _backend(tiny_whisper, monkeypatch, tiny_whisper.multilingual_config)
    text = backend(_audio(0.5))
    ids = tiny_whisper.ids
    expected = [(1, ids["<|en|>"]), (2, ids["<|transcribe|>"]), (3, ids["<|notimestamps|>"])]
    assert isinstance(text, str)
    assert [_prompt_args(c) for c in spy.calls] == [f"forced:{expected}"]
    assert spy.calls[0]["raised"] is None
    assert "attention_mask" in spy.calls[0]
    # The forced ids only apply with language = task = None, and the model's own config is left untouched.
    assert spy.calls[0]["generation_config"].language is None
    assert getattr(tiny_whisper.model.generation_config, "forced_decoder_ids", None) is None


def test_english_only_checkpoint_falls_back_to_bare_generate(tiny_whisper: Any, monkeypatch: pytest.MonkeyPatch):
    backend, spy = _backend(tiny_whisper, monkeypatch, tiny_whisper.english_only_config)
    backend(_audio(0.5))
    # The forced-ids attempt is refused before generate (English-only config); transformers itself rejects
    # language/task; the bare call succeeds.
    assert [_prompt_args(c) for c in spy.calls] == ["english/transcribe", "bare"]
    assert "English-only" in str(spy.calls[0]["raised"])
    assert spy.calls[1]["raised"] is None
    assert all("attention_mask" in c for c in spy.calls)


def test_working_attempt_is_tried_first_on_later_calls(tiny_whisper: Any, monkeypatch: pytest.MonkeyPatch):
    backend, spy = _backend(tiny_whisper, monkeypatch, tiny_whisper.english_only_config)
    backend(_audio(0.3))
    spy.calls.clear()
    backend(_audio(0.3))
    assert [_prompt_args(c) for c in spy.calls] == ["bare"]


def test_forced_decoder_failure_moves_to_language_task(tiny_whisper: Any, monkeypatch: pytest.MonkeyPatch):
    backend, spy = _backend(tiny_whisper, monkeypatch, tiny_whisper.multilingual_config)
    ids = tiny_whisper.ids
    # Ids with a gap (index 2 missing): transformers raises its own "forced_decoder_ids ... prompt pattern" error.
    gapped = [(1, ids["<|en|>"]), (3, ids["<|transcribe|>"])]
    monkeypatch.setattr(hf_whisper, "english_prompt_ids", lambda config, long_form: gapped)
    backend(_audio(0.5))
    assert [_prompt_args(c) for c in spy.calls] == [f"forced:{gapped}", "english/transcribe"]
    assert "forced_decoder_ids" in str(spy.calls[0]["raised"])
    assert spy.calls[1]["raised"] is None
    assert all("attention_mask" in c for c in spy.calls)


def test_unrelated_error_propagates_without_retry(tiny_whisper: Any, monkeypatch: pytest.MonkeyPatch):
    import transformers

    backend, spy = _backend(tiny_whisper, monkeypatch, tiny_whisper.multilingual_config)
    # 128 mel bins into a model built for 80: torch's conv1d fails, which has nothing to do with prompts.
    backend.feature_extractor = transformers.WhisperFeatureExtractor(feature_size=128)
    with pytest.raises(RuntimeError, match="channels"):
        backend(_audio(0.5))
    assert len(spy.calls) == 1


def test_long_audio_is_transcribed_in_full_with_timestamps(tiny_whisper: Any, monkeypatch: pytest.MonkeyPatch):
    backend, spy = _backend(tiny_whisper, monkeypatch, tiny_whisper.english_only_config)
    backend(_audio(61.0))
    assert spy.calls, "generate was never called"
    assert all(c.get("return_timestamps") is True for c in spy.calls)
    assert all("attention_mask" in c for c in spy.calls)
    # 61 s at 100 frames/s: not truncated to the 3000-frame (30 s) window.
    assert all(c["frames"] == 6100 for c in spy.calls)


def test_short_audio_does_not_request_timestamps(tiny_whisper: Any, monkeypatch: pytest.MonkeyPatch):
    backend, spy = _backend(tiny_whisper, monkeypatch, tiny_whisper.multilingual_config)
    backend(_audio(0.1))
    assert spy.calls and all("return_timestamps" not in c for c in spy.calls)
    assert spy.calls[0]["frames"] == 3000


def test_module_entry_point_uses_the_configured_checkpoint(tiny_whisper: Any, monkeypatch: pytest.MonkeyPatch):
    backend, spy = _backend(tiny_whisper, monkeypatch, tiny_whisper.english_only_config)
    backend.model_id = "local/tiny-en"
    monkeypatch.setenv(hf_whisper.HF_WHISPER_MODEL_ENV, "local/tiny-en")
    monkeypatch.setenv("SEED_TTS_EVAL_DEVICE", "cpu")

    def no_download(model_id: str, device: str) -> HFWhisperBackend:
        raise AssertionError(f"tried to load {model_id} on {device}")

    monkeypatch.setattr(hf_whisper, "load_hf_whisper", no_download)
    hf_whisper.clear_hf_whisper_cache()
    hf_whisper.register_hf_whisper(backend)
    try:
        assert isinstance(hf_whisper._transcribe_en_f32_16k(_audio(0.3)), str)
    finally:
        hf_whisper.clear_hf_whisper_cache()
    assert spy.calls and spy.calls[-1]["raised"] is None


@pytest.mark.parametrize(
    ("audio", "match"),
    [
        (np.zeros((2, 100), dtype=np.float32), "mono"),
        (np.zeros(0, dtype=np.float32), "empty"),
        (np.zeros(100, dtype=np.float64), "float32"),
        (np.array([0.0, np.nan], dtype=np.float32), "NaN"),
    ],
)
def test_bad_audio_is_rejected_with_the_reason(audio: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_asr_audio(audio)
