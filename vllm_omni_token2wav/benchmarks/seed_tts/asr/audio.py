# SPDX-License-Identifier: Apache-2.0
"""Read a generated wav as the mono float32 16 kHz signal every Whisper-family ASR expects.

Seed-TTS systems write 22.05/24/48 kHz files, sometimes stereo, sometimes int16 or float. Decoding,
mix-down and band-limited (soxr) resampling are the audio front end's `load_audio`, the same code that
prepares voice prompts, so the gate and the serving path agree on what a file contains. Its ValueErrors
(undecodable container, empty, NaN/Inf, float samples outside [-1, 1]) become `AudioReadError`, which the
scorer records as an "unreadable_audio" row naming the file instead of stopping the run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ASR_SAMPLE_RATE = 16_000


class AudioReadError(ValueError):
    """A generated audio file exists but cannot be used (not decodable, empty, non-finite, out of range)."""


def read_audio_for_asr(path: str | Path, target_rate: int = ASR_SAMPLE_RATE) -> np.ndarray:
    """Mono float32 samples of `path` at `target_rate` (no duration limit); `AudioReadError` on any problem."""
    from vllm_omni_token2wav.model_executor.models.audio import load_audio

    try:
        wav = load_audio(Path(path), target_rate, max_seconds=None)
    except (ValueError, FileNotFoundError) as exc:
        raise AudioReadError(str(exc)) from exc
    return np.ascontiguousarray(wav.numpy(), dtype=np.float32)
