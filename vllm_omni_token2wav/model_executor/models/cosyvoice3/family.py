# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3's facts for the Token2Wav stage: its `FamilySpec` (registered in `token2wav_stage/families.py`).

vLLM-Omni 0.30's talker marks the last chunk with `stream_finished`, sends the whole token prefix
with `left_context_size` = where the new part starts, ends a stream with a token-less `finished`
payload, and names the voice its own way (`voice.read_voice`). The assets are the model folder itself
(`flow.pt`, `hift.pt`, `campplus.onnx`); the default voice is `default_voice.wav` (+ its `.tokens`) or
`$COSYVOICE3_DEFAULT_PROMPT_WAV`.
"""

from __future__ import annotations

from vllm_omni_token2wav.model_executor.layers.flow import ConformerTrim, Lookahead
from vllm_omni_token2wav.model_executor.models.cosyvoice3.voice import read_voice
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import FamilySpec

COSYVOICE3 = FamilySpec(
    name="cosyvoice3",
    last_chunk_key="stream_finished",
    whole_without_stream_meta=True,
    # Not used: CosyVoice3's flow has neither a conformer nor a prompt lookahead at set-up.
    lookahead=Lookahead.PROMPT_HEAD,
    conformer_trim=ConformerTrim.NONE,
    default_voice_names=("default_voice.wav",),
    default_voice_env="COSYVOICE3_DEFAULT_PROMPT_WAV",
    asset_markers=("flow.pt", "hift.pt", "campplus.onnx"),
    # `CosyVoice3Token2Wav.check_assets` + the default voice's prompt tokens (`prompt.voice_tokens_path`).
    hub_files=("flow.pt", "hift.pt", "campplus.onnx", "cosyvoice3.yaml", "default_voice.tokens"),
    prefix_offset_key="left_context_size",
    end_marker_key="finished",
    voice_reader=read_voice,
    # upstream's pipeline declares engine_output_type `latent` for this stage, so `model_outputs` would reach
    # the client as `latent`, which the speech endpoint rejects; upstream's own stage returns `audio`.
    output_key="audio",
)

__all__ = ["COSYVOICE3"]
