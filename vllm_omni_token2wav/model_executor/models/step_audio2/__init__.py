# SPDX-License-Identifier: Apache-2.0
"""Step-Audio2 Token2Wav: the lazy core facade shared by Step-Audio2, MiniCPM-o 4.5 and CosyVoice3.

`step_audio2_token2wav.StepAudio2Token2WavCore` (prompt path, backend switch), `prompt_features`
(the `PromptFeatures` dataclass, content digests) and `prompt_cache` (thread-safe content LRU).
"""
