# SPDX-License-Identifier: Apache-2.0
"""MiniCPM-o 4.5's facts, all of them: its `FAMILY` record (listed in `token2wav_stage/families.py:FAMILY_MODULES`).

Its producer marks the last chunk with `meta.last_chunk`; a payload without stream meta is a
one-chunk stream (MiniCPM-o streams every reply); the prompt lookahead at set-up is 3 silence tokens;
the conformer cache is trimmed to prompt + 100 frames; the default voice is `HT_ref_audio.wav`.
Upstream's `MiniCPMO45Code2Wav` (stage `code2wav`, fed by the talker `tts`) is served by our class; the
real folder keeps the assets in `assets/token2wav/`. Strings and small records only: nothing heavy imports.
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

MINICPMO_4_5 = FamilySpec(
    name="minicpmo_4_5",
    last_chunk_key="last_chunk",
    whole_without_stream_meta=False,
    default_voice_names=("HT_ref_audio.wav",),
    cosyvoice2_flow=CosyVoice2FlowRules(lookahead="silence", conformer_trim="prompt_plus_tail"),
)

FAMILY = Family(
    spec=MINICPMO_4_5,
    serving=StageServing(
        stage_class="vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav:MiniCPMO45Code2Wav",
        upstream_architectures=("MiniCPMO45Code2Wav",),
        facade_class="vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_token2wav:MiniCPMO45Token2WavCore",
    ),
    pipelines=PipelineFacts(
        code2wav_arch="MiniCPMO45Code2Wav",
        code2wav_stage="code2wav",
        async_chunk_func="vllm_omni.model_executor.stage_input_processors.minicpmo_4_5_omni.tts2code2wav_async_chunk",
        producer_stage="tts",
        deploy_yamls=("minicpmo_4_5_code2wav",),
        upstream_deploy=("minicpmo_4_5.yaml", 2),
    ),
    standin=StandinLayout(
        asset_subdir="assets/token2wav", root_config_arch="MiniCPMO45Code2Wav", assets_copies=("HT_ref_audio.wav",)
    ),
    producer=ProducerShape(
        chunking="context_window",
        meta_keys=("request_id", "chunk_seq", "cache_epoch", "last_chunk", "code_flat_numel"),
    ),
    cli_name="minicpmo_4_5",
)

__all__ = ["FAMILY", "MINICPMO_4_5"]
