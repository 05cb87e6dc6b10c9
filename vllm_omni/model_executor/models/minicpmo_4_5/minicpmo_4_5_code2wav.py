# SPDX-License-Identifier: Apache-2.0
"""MiniCPM-o 4.5 code2wav (stage 2): the Token2Wav facade as the stage builds it.

The stage turns codec tokens into 24 kHz audio in the voice of a reference clip. This module holds
what the stage decides at start-up: the facade built from the stage config, the reference audio
normalised once (24 kHz mono, fixed length, default 6 s, as MiniCPM-o does), and the platform
switch: on Ascend (`current_omni_platform.is_npu()`) the speaker embedding moves to the NPU via
`enable_device_spk_embedding()`; a failure there fails the stage rather than silently keeping the
host-blocking CPU session.

Synthesis follows MiniCPM-o: every reply is streamed, also when the caller wants the whole reply at
once, because the flow model was tuned on the chunked causal path. `synthesize(codes)` runs the
reference chunking over all codes and returns the concatenated waveform; `start_stream()` /
`stream()` serve codes as the talker produces them, one state object per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vllm_omni.logger import init_logger
from vllm_omni.model_executor.models.minicpmo_4_5.minicpmo_4_5_token2wav import MiniCPMO45Token2wav
from vllm_omni.model_executor.models.step_audio2.prompt_features import PROMPT_MEL_RATE, PromptFeatures
from vllm_omni.model_executor.models.step_audio2.step_audio2_token2wav import PromptWav
from vllm_omni.model_executor.models.step_audio2.token2wav_stream import (
    PRE_LOOKAHEAD_TOKENS,
    Token2WavStream,
    stream_chunks,
)
from vllm_omni.model_executor.models.step_audio2.token2wav_synthesis import SpeechTokens
from vllm_omni.platforms import DeviceSpec

logger = init_logger(__name__)


@dataclass(frozen=True)
class MiniCPMO45Code2WavConfig:
    """Stage configuration (the token2wav part of MiniCPM-o's stage-2 config).

    `reference_audio` is the default voice (path, bytes or `(waveform, rate)`), normalised to
    `reference_seconds` of 24 kHz mono (cut or zero-padded at the end). `chunk_tokens` and
    `left_context_frames` are the streaming geometry of `synthesize`: chunks of `chunk_tokens`
    codes, each non-final one followed by the `left_context_frames` codes that open the next chunk
    (the flow model's pre-lookahead, which is fixed at 3 by the model).
    """

    model_path: str | Path
    reference_audio: PromptWav | None = None
    reference_seconds: float = 6.0
    chunk_tokens: int = 25
    left_context_frames: int = 3
    n_timesteps: int = 10
    float16: bool = False
    device: DeviceSpec = None
    prompt_cache_size: int = 8

    def __post_init__(self) -> None:
        if not self.reference_seconds > 0:
            raise ValueError(f"reference_seconds must be > 0, got {self.reference_seconds!r}")
        if self.chunk_tokens < 4:
            raise ValueError(
                f"chunk_tokens must be >= 4 (the vocoder re-uses 8 mel frames = 4 codes of each chunk), "
                f"got {self.chunk_tokens}"
            )
        if self.left_context_frames != PRE_LOOKAHEAD_TOKENS:
            raise ValueError(
                f"left_context_frames must be {PRE_LOOKAHEAD_TOKENS}, the flow model's pre-lookahead, "
                f"got {self.left_context_frames}"
            )


def normalize_reference_audio(source: PromptWav, seconds: float) -> np.ndarray:
    """`source` as float32 mono 24 kHz of exactly `round(seconds * 24000)` samples (cut or zero-padded)."""
    from vllm_omni.model_executor.models import audio as frontend

    loaded = frontend.load_audio(source, PROMPT_MEL_RATE, max_seconds=seconds, truncate=True)
    wav = np.ascontiguousarray(loaded.detach().cpu().numpy(), dtype=np.float32).reshape(-1)
    target = round(seconds * PROMPT_MEL_RATE)
    if wav.shape[0] >= target:
        return wav[:target].copy()
    return np.concatenate([wav, np.zeros(target - wav.shape[0], dtype=np.float32)])


class MiniCPMO45Code2Wav:
    """Stage-2 Token2Wav of MiniCPM-o 4.5: codec tokens -> 24 kHz audio in the configured voice."""

    def __init__(self, config: MiniCPMO45Code2WavConfig) -> None:
        from vllm_omni import platforms

        self.config = config
        self.token2wav = MiniCPMO45Token2wav(
            config.model_path,
            float16=config.float16,
            n_timesteps=config.n_timesteps,
            device=config.device,
            prompt_cache_size=config.prompt_cache_size,
        )
        self.reference: tuple[np.ndarray, int] | None = None
        if config.reference_audio is not None:
            wav = normalize_reference_audio(config.reference_audio, config.reference_seconds)
            self.reference = (wav, PROMPT_MEL_RATE)
        if platforms.current_omni_platform.is_npu():
            name = self.token2wav.enable_device_spk_embedding()
            logger.info("code2wav: NPU platform, speaker embedding on the device (%s)", name)

    @property
    def spk_backend(self) -> str:
        return self.token2wav.spk_backend

    def prompt_features(self, prompt_wav: PromptWav | None = None) -> PromptFeatures:
        """Prompt features of `prompt_wav`, or of the configured reference voice when None."""
        if prompt_wav is None:
            if self.reference is None:
                raise ValueError("no prompt audio given and the stage config has no reference_audio")
            prompt_wav = self.reference
        return self.token2wav.prepare_prompt(prompt_wav)

    def _prompt(self, prompt_wav: PromptWav | None) -> PromptWav:
        if prompt_wav is not None:
            return prompt_wav
        if self.reference is None:
            raise ValueError("no prompt audio given and the stage config has no reference_audio")
        return self.reference

    def start_stream(self, prompt_wav: PromptWav | None = None) -> Token2WavStream:
        """A new request's stream state in the voice of `prompt_wav` (default: the reference voice)."""
        return self.token2wav.set_stream_cache(self._prompt(prompt_wav))

    def stream(self, state: Token2WavStream, codes: SpeechTokens, last_chunk: bool = False) -> torch.Tensor:
        """New audio `[1, N]` float32 of one chunk (`chunk_tokens` codes + 3 lookahead, or the final rest)."""
        out = self.token2wav.stream(codes, None, last_chunk, True, state=state)
        assert isinstance(out, torch.Tensor)
        return out

    def synthesize(self, codes: SpeechTokens, prompt_wav: PromptWav | None = None) -> torch.Tensor:
        """The whole reply's waveform `[1, 480 * 2 * len(codes)]`, streamed in the configured chunks."""
        state = self.start_stream(prompt_wav)
        pieces = [
            self.stream(state, chunk, last)
            for chunk, last in stream_chunks(codes, self.config.chunk_tokens, self.config.left_context_frames)
        ]
        return torch.cat(pieces, dim=1)
