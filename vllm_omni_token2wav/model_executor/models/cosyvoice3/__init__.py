# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3 model family: speaker-embedding backends (ORT / torch / TensorRT) and the Token2Wav facade.

`speaker_embedding.select_speaker_embedding_backend` is the one place that decides where the CAM++
speaker embedding runs; `cosyvoice3_token2wav.CosyVoice3Token2Wav` is the facade over CosyVoice3 assets.
"""
