# SPDX-License-Identifier: Apache-2.0
"""The toy family's facts, all of them: a Step-Audio2-like family under its own architecture name (tests only).

What differs from Step-Audio2: the architecture (`ToyToken2WavModel`, a name upstream does not use, so it is
added, not overriding anything), the last-chunk key (`meta.last_chunk`, a bool, like MiniCPM-o's) and the
stage's model_stage / producer names; it reuses the shared core, the stand-in token2wav assets (layout
`token2wav/`, default voice `default_female.wav`) and Step-Audio2's code2wav deploy YAML as an overlay base.
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

TOY_ARCH = "ToyToken2WavModel"

TOY_TOKEN2WAV = FamilySpec(
    name="toy_token2wav",
    last_chunk_key="last_chunk",
    whole_without_stream_meta=True,
    default_voice_names=("default_female.wav",),
    cosyvoice2_flow=CosyVoice2FlowRules(lookahead="prompt_head", conformer_trim="none"),
)

FAMILY = Family(
    spec=TOY_TOKEN2WAV,
    serving=StageServing(
        stage_class="tests.plugins.toy_family.toy_token2wav:ToyToken2Wav", added_architectures=(TOY_ARCH,)
    ),
    pipelines=PipelineFacts(
        code2wav_arch=TOY_ARCH,
        code2wav_stage="toy_token2wav",
        async_chunk_func="vllm_omni.model_executor.stage_input_processors.step_audio2.thinker2token2wav_async_chunk",
        producer_stage="toy_thinker",
    ),
    standin=StandinLayout(asset_subdir="token2wav", root_config_arch=TOY_ARCH),
    producer=ProducerShape(chunking="lookahead_window", meta_keys=("last_chunk",)),
    cli_name="toy_token2wav",
)

__all__ = ["FAMILY", "TOY_ARCH", "TOY_TOKEN2WAV"]
