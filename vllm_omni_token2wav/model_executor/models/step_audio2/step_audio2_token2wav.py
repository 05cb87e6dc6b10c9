# SPDX-License-Identifier: Apache-2.0
"""Step-Audio2's Token2Wav facade: `StepAudio2Token2WavCore`, the shared Token2Wav core under its public name.

Step-Audio2 ships the asset layout the core was written for (`flow.yaml`, `flow.pt`, `hift.pt`,
`campplus.onnx`, `speech_tokenizer_v2_25hz.onnx`), so its facade is the core with nothing added
(`token2wav_core/core.py`, where the lifecycle table and request paths are documented). The name
stays here because the public API, the CLI and the benchmarks build Step-Audio2 by it.
"""

from __future__ import annotations

from vllm_omni_token2wav.model_executor.models.token2wav_core.core import (
    DEFAULT_PROMPT_CACHE_SIZE,
    PromptWav,
    Token2WavCore,
)


class StepAudio2Token2WavCore(Token2WavCore):
    """Step-Audio2's Token2Wav facade: the shared core, unchanged, under the name logs and errors show."""


__all__ = ["DEFAULT_PROMPT_CACHE_SIZE", "PromptWav", "StepAudio2Token2WavCore"]
