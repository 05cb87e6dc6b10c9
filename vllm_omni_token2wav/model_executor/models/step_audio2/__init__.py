# SPDX-License-Identifier: Apache-2.0
"""Step-Audio2 Token2Wav: its facade name, its serving stage and its stand-in asset folder.

`step_audio2_token2wav.StepAudio2Token2WavCore` (the shared `token2wav_core.Token2WavCore` under
Step-Audio2's name), `step_audio2_token2wav_stage` (the vLLM-Omni stage class) and `standin` (the
stand-in token2wav folder, also MiniCPM-o 1.0.7's layout). The core itself, prompt features, caches,
synthesis and streaming live in `token2wav_core/`, shared with MiniCPM-o 4.5 and CosyVoice3.
"""
