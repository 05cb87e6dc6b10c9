# SPDX-License-Identifier: Apache-2.0
"""MiniCPM-o 4.5's facts for the Token2Wav stage: its `FamilySpec` (registered in `token2wav_stage/families.py`).

Its producer marks the last chunk with `meta.last_chunk`; a payload without stream meta is a
one-chunk stream (MiniCPM-o streams every reply); the prompt lookahead at set-up is 3 silence tokens;
the conformer cache is trimmed to prompt + 100 frames; the default voice is `HT_ref_audio.wav`.
"""

from __future__ import annotations

from vllm_omni_token2wav.model_executor.layers.flow import ConformerTrim, Lookahead
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import FamilySpec

MINICPMO_4_5 = FamilySpec(
    name="minicpmo_4_5",
    last_chunk_key="last_chunk",
    whole_without_stream_meta=False,
    lookahead=Lookahead.SILENCE,
    conformer_trim=ConformerTrim.PROMPT_PLUS_TAIL,
    default_voice_names=("HT_ref_audio.wav",),
)

__all__ = ["MINICPMO_4_5"]
