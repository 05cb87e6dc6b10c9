# SPDX-License-Identifier: Apache-2.0
"""Audio front end of the Token2Wav stage, in torch on the serving device.

- `kaldi_fbank`: Kaldi-compatible log mel filter bank (replaces torchaudio.compliance.kaldi.fbank).
- `speaker_fbank`: the geometry of the CAM++ input (16 kHz, 80 bins, >= 4 frames); the features
  themselves are `speaker_embedding.features.speaker_features`, one layer up.
- `prompt_mel_24k`: the flow model's 24 kHz prompt log mel (Matcha-TTS / CosyVoice recipe).
- `load_audio` / `load_prompt_audio`: decoding, normalisation, mix-down and band-limited resampling
  of prompt audio on the host (16 kHz and 24 kHz copies both from the original).

Formulas, references and measured agreement: docs/design/audio_frontend.md.
"""

from vllm_omni_token2wav.model_executor.models.audio.kaldi_fbank import FLT_EPSILON, FbankOptions, kaldi_fbank
from vllm_omni_token2wav.model_executor.models.audio.loading import (
    DEFAULT_MAX_PROMPT_SECONDS,
    MIN_ACTIVE_SECONDS,
    MIN_PROMPT_PEAK_DBFS,
    AudioSource,
    AudioTooLongError,
    DecodedAudio,
    PromptActivity,
    PromptAudio,
    decode_audio,
    load_audio,
    load_prompt_audio,
    peak_dbfs_after_dc_removal,
    prompt_activity,
)
from vllm_omni_token2wav.model_executor.models.audio.mel import (
    PROMPT_MEL_CONFIG,
    MelConfig,
    log_mel_spectrogram,
    prompt_mel_24k,
)
from vllm_omni_token2wav.model_executor.models.audio.resample import MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, resample
from vllm_omni_token2wav.model_executor.models.audio.speaker_fbank import (
    MIN_SPEAKER_FRAMES,
    SPEAKER_SAMPLE_RATE,
    min_speaker_samples,
)

__all__ = [
    "DEFAULT_MAX_PROMPT_SECONDS",
    "FLT_EPSILON",
    "MAX_SAMPLE_RATE",
    "MIN_ACTIVE_SECONDS",
    "MIN_PROMPT_PEAK_DBFS",
    "MIN_SAMPLE_RATE",
    "MIN_SPEAKER_FRAMES",
    "PROMPT_MEL_CONFIG",
    "SPEAKER_SAMPLE_RATE",
    "AudioSource",
    "AudioTooLongError",
    "DecodedAudio",
    "FbankOptions",
    "MelConfig",
    "PromptActivity",
    "PromptAudio",
    "decode_audio",
    "kaldi_fbank",
    "load_audio",
    "load_prompt_audio",
    "log_mel_spectrogram",
    "min_speaker_samples",
    "peak_dbfs_after_dc_removal",
    "prompt_activity",
    "prompt_mel_24k",
    "resample",
]
