# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3's Token2Wav facade: the same speaker front end and device switch, CosyVoice3's files.

Fun-CosyVoice3 ships the same `campplus.onnx` as Step-Audio2 and computes its prompt features the
same way (16 kHz fbank minus mean -> CAM++; 24 kHz mel at 50 frames/s), but names its speech
tokenizer `speech_tokenizer_v3.onnx` and keeps the flow configuration in the model's
`cosyvoice3.yaml` instead of a `flow.yaml`. Sharing the Step-Audio2 core keeps one implementation
of backend selection, laziness and prompt caching for all three model families.
"""

from __future__ import annotations

from typing import ClassVar

from vllm_omni.model_executor.models.step_audio2.step_audio2_token2wav import (
    StepAudio2Token2WavCore,
    Token2WavAssets,
)

COSYVOICE3_ASSETS = Token2WavAssets(
    speaker_model="campplus.onnx",
    speech_tokenizer="speech_tokenizer_v3.onnx",
    flow_config=None,
    flow="flow.pt",
    hift="hift.pt",
)


class CosyVoice3Token2Wav(StepAudio2Token2WavCore):
    """Prompt path of CosyVoice3's token2wav over a Fun-CosyVoice3 model directory (no synthesis yet).

    Same constructor, laziness, `enable_device_spk_embedding()` / `enable_trt_spk_embedding()`,
    `prepare_prompt()` and cache as `StepAudio2Token2WavCore`; only the asset names differ.
    """

    assets: ClassVar[Token2WavAssets] = COSYVOICE3_ASSETS
    # CosyVoice3's flow (cosyvoice3.yaml) and speech_tokenizer_v3 have no in-tree models yet:
    # `_ensure_models_loaded()` readies the speaker path only and synthesis raises NotImplementedError.
    supports_synthesis: ClassVar[bool] = False
