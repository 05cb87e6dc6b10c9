# SPDX-License-Identifier: Apache-2.0
"""Step-Audio2's facts for the Token2Wav stage: its `FamilySpec` (registered in `token2wav_stage/families.py`).

Its producer marks the last chunk with `meta.left_context_size == 1`; a segment without stream meta
is a whole utterance (upstream's sync path); the prompt's lookahead is its first three tokens; the
conformer cache is not trimmed; the default voice is `default_female.wav` or the file named by
`$STEP_AUDIO2_DEFAULT_PROMPT_WAV`.
"""

from __future__ import annotations

from vllm_omni_token2wav.model_executor.layers.flow import ConformerTrim, Lookahead
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import FamilySpec

STEP_AUDIO2 = FamilySpec(
    name="step_audio2",
    last_chunk_key="left_context_size",
    whole_without_stream_meta=True,
    lookahead=Lookahead.PROMPT_HEAD,
    conformer_trim=ConformerTrim.NONE,
    default_voice_names=("default_female.wav",),
    default_voice_env="STEP_AUDIO2_DEFAULT_PROMPT_WAV",
)

__all__ = ["STEP_AUDIO2"]
