# SPDX-License-Identifier: Apache-2.0
"""Step-Audio2's token2wav stage as vLLM-Omni builds it: `StepAudio2Token2WavForConditionalGeneration`.

vLLM-Omni runs Step-Audio2 as thinker -> token2wav. Upstream's stage model streams one request per
step (it raises on a second) and keeps one stream state without request ids; this one is the shared
Token2Wav stage (`token2wav_stage/` over `token2wav_core/`, docs/design/token2wav_stage.md): any number of requests per
step, one stream per request id, batched across requests, each request's audio equal to its solo
run. What is Step-Audio2's (`family.STEP_AUDIO2`): `meta.left_context_size == 1` marks the last
chunk (its producer sends no chunk_seq / cache_epoch, so chunks are taken in arrival order); a
segment without stream meta is a whole utterance (bidirectional flow, upstream's sync path); the
prompt's lookahead is its first three tokens and the conformer cache is not trimmed (streams past
~94 s get a clear error); the assets are `<model>/token2wav` (or `hf_config.token2wav_path`) and the
default voice `default_female.wav` (or `$STEP_AUDIO2_DEFAULT_PROMPT_WAV`).
"""

from __future__ import annotations

from typing import ClassVar

from vllm_omni_token2wav.model_executor.models.step_audio2.family import STEP_AUDIO2
from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav import StepAudio2Token2WavCore
from vllm_omni_token2wav.model_executor.models.token2wav_core.stage import CoreStageModel
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import FamilySpec


class StepAudio2Token2WavForConditionalGeneration(CoreStageModel):
    """Step-Audio2's Token2Wav stage (see the module docstring)."""

    family: ClassVar[FamilySpec] = STEP_AUDIO2
    core_class: ClassVar[type[StepAudio2Token2WavCore]] = StepAudio2Token2WavCore


__all__ = ["StepAudio2Token2WavForConditionalGeneration"]
