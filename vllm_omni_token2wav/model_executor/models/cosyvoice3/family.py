# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3's facts, all of them: its `FAMILY` record (listed in `token2wav_stage/families.py:FAMILY_MODULES`).

vLLM-Omni 0.30's talker marks the last chunk with `stream_finished`, sends the whole token prefix
with `left_context_size` = where the new part starts, ends a stream with a token-less `finished`
payload, and names the voice its own way (`voice.read_voice`). The assets are the model folder itself
(`flow.pt`, `hift.pt`, `campplus.onnx`); the default voice is `default_voice.wav` (+ its `.tokens`) or
`$COSYVOICE3_DEFAULT_PROMPT_WAV`. Its own flow (no `cosyvoice2_flow` part). Upstream's ONE class
`CosyVoice3Model` (talker and code2wav) is served by ours, which builds upstream's talker or our code2wav;
the real folder has a `{}` config and a `CosyVoice-BlankEN/` tokenizer. Strings and small records only.
"""

from __future__ import annotations

from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import (
    Family,
    FamilySpec,
    ImportedFunction,
    PipelineFacts,
    ProducerShape,
    StageServing,
    StandinLayout,
)

COSYVOICE3 = FamilySpec(
    name="cosyvoice3",
    last_chunk_key="stream_finished",
    whole_without_stream_meta=True,
    default_voice_names=("default_voice.wav",),
    default_voice_env="COSYVOICE3_DEFAULT_PROMPT_WAV",
    asset_markers=("flow.pt", "hift.pt", "campplus.onnx"),
    # `CosyVoice3Token2Wav.check_assets` + the default voice's prompt tokens (`prompt.voice_tokens_path`).
    hub_files=("flow.pt", "hift.pt", "campplus.onnx", "cosyvoice3.yaml", "default_voice.tokens"),
    prefix_offset_key="left_context_size",
    end_marker_key="finished",
    voice_reader=ImportedFunction("vllm_omni_token2wav.model_executor.models.cosyvoice3.voice:read_voice"),
    # upstream's pipeline declares engine_output_type `latent` for this stage, so `model_outputs` would reach
    # the client as `latent`, which the speech endpoint rejects; upstream's own stage returns `audio`.
    output_key="audio",
)

FAMILY = Family(
    spec=COSYVOICE3,
    serving=StageServing(
        stage_class="vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_model:CosyVoice3Model",
        upstream_architectures=("CosyVoice3Model",),
        facade_class="vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_token2wav:CosyVoice3Token2Wav",
    ),
    pipelines=PipelineFacts(
        code2wav_arch="CosyVoice3Model",
        code2wav_stage="cosyvoice3_code2wav",
        async_chunk_func="vllm_omni.model_executor.stage_input_processors.cosyvoice3.talker2code2wav_async_chunk",
        producer_stage="standin_producer",
        standin_stream=True,
        deploy_yamls=("cosyvoice3_code2wav", "standin_cosyvoice3_stream"),
        upstream_deploy=("cosyvoice3.yaml", 1),
    ),
    standin=StandinLayout(asset_subdir="", assets="cosyvoice3", tokenizer_subdir="CosyVoice-BlankEN"),
    producer=ProducerShape(
        chunking="growing_prefix", meta_keys=("req_id", "finished", "left_context_size", "stream_finished")
    ),
    cli_name="cosyvoice3",
)

__all__ = ["COSYVOICE3", "FAMILY"]
