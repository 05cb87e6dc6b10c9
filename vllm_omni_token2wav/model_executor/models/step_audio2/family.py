# SPDX-License-Identifier: Apache-2.0
"""Step-Audio2's facts, all of them: its `FAMILY` record (listed in `token2wav_stage/families.py:FAMILY_MODULES`).

Its producer marks the last chunk with `meta.left_context_size == 1`; a segment without stream meta
is a whole utterance (upstream's sync path); the prompt's lookahead is its first three tokens; the
conformer cache is not trimmed; the default voice is `default_female.wav` or the file named by
`$STEP_AUDIO2_DEFAULT_PROMPT_WAV`. Upstream's `StepAudio2Token2WavForConditionalGeneration` (and the alias
`StepAudio2Token2WavModel` its pipeline uses; stage `token2wav`, fed by `step_audio2_thinker`) is served by
our class; the real folder keeps the assets in `token2wav/`; its audio tokens follow the text vocabulary
(151696). Strings and small records only: nothing heavy imports.
"""

from __future__ import annotations

from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import (
    CosyVoice2FlowRules,
    Family,
    FamilySpec,
    PipelineFacts,
    ProducerShape,
    StageServing,
    StandinLayout,
)

STEP_AUDIO2 = FamilySpec(
    name="step_audio2",
    last_chunk_key="left_context_size",
    whole_without_stream_meta=True,
    default_voice_names=("default_female.wav",),
    default_voice_env="STEP_AUDIO2_DEFAULT_PROMPT_WAV",
    cosyvoice2_flow=CosyVoice2FlowRules(lookahead="prompt_head", conformer_trim="none"),
)

FAMILY = Family(
    spec=STEP_AUDIO2,
    serving=StageServing(
        stage_class="vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav_stage:"
        "StepAudio2Token2WavForConditionalGeneration",
        upstream_architectures=("StepAudio2Token2WavForConditionalGeneration", "StepAudio2Token2WavModel"),
        facade_class="vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav:StepAudio2Token2WavCore",
    ),
    pipelines=PipelineFacts(
        code2wav_arch="StepAudio2Token2WavModel",
        code2wav_stage="token2wav",
        async_chunk_func="vllm_omni.model_executor.stage_input_processors.step_audio2.thinker2token2wav_async_chunk",
        producer_stage="step_audio2_thinker",
        standin_stream=True,
        deploy_yamls=("step_audio2_code2wav", "standin_step_audio2_stream"),
        upstream_deploy=("step_audio_2.yaml", 1),
    ),
    standin=StandinLayout(
        asset_subdir="token2wav", root_config_arch="StepAudio2Token2WavModel", producer_codec_offset=151696
    ),
    producer=ProducerShape(chunking="lookahead_window", meta_keys=("left_context_size",)),
    cli_name="step_audio2",
)

__all__ = ["FAMILY", "STEP_AUDIO2"]
