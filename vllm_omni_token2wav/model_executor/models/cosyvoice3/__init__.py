# SPDX-License-Identifier: Apache-2.0
"""The CosyVoice3 family (Fun-CosyVoice3-0.5B): its stage class, facade, synthesis backend and voice reader.

`cosyvoice3_code2wav.CosyVoice3Code2Wav` is the stage class vLLM-Omni builds for `CosyVoice3Model`'s code2wav
stage; `cosyvoice3_token2wav.CosyVoice3Token2Wav` is the facade over a Fun-CosyVoice3 folder (the DiT flow
`layers/flow_cosyvoice3/`, the causal HiFT `layers/hift_causal/`); `voice.py` reads upstream's prompt
conditioning. The speaker embedding is not here: `model_executor/models/speaker_embedding/`.
"""
