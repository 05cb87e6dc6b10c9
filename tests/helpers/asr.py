# SPDX-License-Identifier: Apache-2.0
"""A stand-in ASR backend for the Seed-TTS gate tests: the transcription is looked up from the audio.

The tests generate audio whose length encodes which text it stands for, so a deterministic "ASR"
can read the text back without a model: `KeyedASR(texts, key)` returns `texts[key(audio)]`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


class KeyedASR:
    """`ASRBackend` stand-in: `texts[key(audio)]`, with the attributes the scorer reports."""

    model_id = "stub"
    device = "cpu"
    locale = "en"

    def __init__(self, name: str, texts: Mapping[int, str], key: Callable[[Any], int]) -> None:
        self.name, self.texts, self.key = name, texts, key

    def __call__(self, audio: Any) -> str:
        return self.texts[self.key(audio)]
