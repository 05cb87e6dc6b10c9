# SPDX-License-Identifier: Apache-2.0
"""Which ASR backend and device a run gets (the table in `select_asr_backend`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from vllm_omni_token2wav import platforms
from vllm_omni_token2wav.benchmarks.seed_tts import asr
from vllm_omni_token2wav.benchmarks.seed_tts.asr import faster_whisper_backend as fw
from vllm_omni_token2wav.benchmarks.seed_tts.asr import hf_whisper
from vllm_omni_token2wav.platforms.interface import DevicePlatform

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


@pytest.fixture
def loaders(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any, str]]:
    """Replace the loaders with recorders so selection is tested without loading weights."""
    calls: list[tuple[str, Any, str]] = []
    monkeypatch.setattr(hf_whisper, "get_hf_whisper", lambda model, dev: calls.append(("hf", model, dev)) or "hf")
    monkeypatch.setattr(fw, "load_faster_whisper", lambda model, dev: calls.append(("fw", model, dev)) or "fw")
    monkeypatch.delenv(hf_whisper.HF_WHISPER_MODEL_ENV, raising=False)
    monkeypatch.setenv(asr.ASR_DEVICE_ENV, "cpu")
    return calls


def _ct2_dir(tmp_path: Path) -> Path:
    (tmp_path / "model.bin").write_bytes(b"")
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def test_auto_prefers_the_bundled_offline_model(loaders, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(fw, "bundled_tiny_en_path", lambda: tmp_path)
    assert asr.select_asr_backend("auto") == "fw"
    assert loaders == [("fw", None, "cpu")]


def test_auto_uses_hf_whisper_when_a_checkpoint_is_configured(loaders, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fw, "bundled_tiny_en_path", lambda: Path("/bundled"))
    monkeypatch.setenv(hf_whisper.HF_WHISPER_MODEL_ENV, "openai/whisper-large-v3")
    assert asr.select_asr_backend("auto") == "hf"
    assert asr.select_asr_backend("auto", model="some/hub-id") == "hf"
    assert loaders == [("hf", None, "cpu"), ("hf", "some/hub-id", "cpu")]


def test_auto_routes_a_ctranslate2_folder_to_faster_whisper(loaders, tmp_path: Path) -> None:
    folder = _ct2_dir(tmp_path)
    assert asr.select_asr_backend("auto", model=str(folder)) == "fw"


def test_auto_without_bundled_model_falls_back_to_large_v3(loaders, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fw, "bundled_tiny_en_path", lambda: None)
    assert asr.select_asr_backend("auto") == "hf"


def test_locale_and_backend_mismatches_are_errors(loaders) -> None:
    with pytest.raises(ValueError, match="English-only"):
        asr.select_asr_backend("hf-whisper", locale="zh")
    with pytest.raises(ValueError, match="for zh"):
        asr.select_asr_backend("paraformer", locale="en")
    with pytest.raises(ValueError, match="unknown ASR backend"):
        asr.select_asr_backend("kaldi")
    with pytest.raises(FileNotFoundError, match="not a CTranslate2 model folder"):
        asr.select_asr_backend("faster-whisper", model="/no/such/dir")


def test_zh_without_funasr_says_how_to_enable_it(loaders, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "funasr", None)  # import funasr -> ImportError
    with pytest.raises(ImportError, match="pip install funasr"):
        asr.select_asr_backend("auto", locale="zh")


def test_device_priority_argument_env_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    class FakeNpu(DevicePlatform):
        device_type = "npu"

        def current_device_index(self) -> int | None:
            return 0

    monkeypatch.setenv(asr.ASR_DEVICE_ENV, "cuda:1")
    assert asr.resolve_asr_device("cpu") == "cpu"
    assert asr.resolve_asr_device(None) == "cuda:1"
    monkeypatch.delenv(asr.ASR_DEVICE_ENV)
    platforms.reset_current_platform(FakeNpu())
    try:
        assert asr.resolve_asr_device(None) == "npu:0"
    finally:
        platforms.reset_current_platform(None)
