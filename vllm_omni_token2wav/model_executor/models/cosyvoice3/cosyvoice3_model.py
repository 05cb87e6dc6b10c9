# SPDX-License-Identifier: Apache-2.0
"""vLLM-Omni's `CosyVoice3Model` architecture with our code2wav stage: the talker stays upstream's.

vLLM-Omni 0.30 registers one class, `CosyVoice3Model`, for both CosyVoice3 stages and picks the
half in `__init__` from `model_config.model_stage` ("cosyvoice3_talker" or "cosyvoice3_code2wav").
Replacing only the code2wav half needs a class under that name that decides at construction:
`CosyVoice3Model(vllm_config=..., prefix=...)` returns our `CosyVoice3Code2Wav` for the code2wav
stage and an instance of upstream's class (this subclass adds nothing to it) for every other stage.
Being a subclass keeps what vLLM reads off the class before construction identical to upstream's
(its multimodal processor registration, `supports_multimodal`, ...); what the runner reads off the
built model for the code2wav stage is our stage model's.

This module imports vLLM-Omni at the top: only the engine (through the plugin's registry entry)
imports it.
"""

from __future__ import annotations

from typing import Any

from vllm_omni.model_executor.models.cosyvoice3.cosyvoice3 import CosyVoice3Model as UpstreamCosyVoice3Model

from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_code2wav import CosyVoice3Code2Wav

CODE2WAV_STAGE = "cosyvoice3_code2wav"


class CosyVoice3Model(UpstreamCosyVoice3Model):
    """Upstream's CosyVoice3 talker, or our code2wav stage for `model_stage == "cosyvoice3_code2wav"`."""

    def __new__(cls, *args: Any, vllm_config: Any = None, prefix: str = "", **kwargs: Any) -> Any:
        stage = getattr(getattr(vllm_config, "model_config", None), "model_stage", None)
        if stage == CODE2WAV_STAGE:
            return CosyVoice3Code2Wav(vllm_config=vllm_config, prefix=prefix)
        return super().__new__(cls)


__all__ = ["CODE2WAV_STAGE", "CosyVoice3Model"]
