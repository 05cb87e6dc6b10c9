# SPDX-License-Identifier: Apache-2.0
"""MiniCPM-o 4.5 code2wav (stage 2) as vLLM-Omni builds it: `MiniCPMO45Code2Wav(*, vllm_config, prefix)`.

The stage turns the talker's codec chunks of many concurrent requests into 24 kHz audio, one
`forward` per scheduler step; the contract, the per-request streams, the cross-request batching
and the memory bounds are the shared Token2Wav stage (`token2wav_stage/`, design in
docs/design/token2wav_stage.md). What is MiniCPM-o's (`family.MINICPMO_4_5`): `meta.last_chunk`
marks the last chunk, every reply is streamed (a payload without stream meta is a one-chunk
stream), the assets are in `<model>/assets/token2wav` and the default voice is
`<model>/assets/HT_ref_audio.wav`. Every reference voice is normalised to 24 kHz mono of a fixed
length (`ref_audio_max_seconds`, default 6 s), as MiniCPM-o does. The stream rules are the
MiniCPM-o variant's (`variants.MiniCPMOVariant`, stage option `token2wav_variant` / `variant=`):
vLLM-Omni 0.30's by default (three silence tokens as the prompt's lookahead, the conformer cache
trimmed like the estimator's, HiFT with a cross-fade), or minicpmo-utils 1.0.7's (causal vocoder,
its assets in the same folder); requests of either batch the same way.

Outside the runner, `start_stream` / `stream` / `synthesize` serve one request through the same
kernels (the Token2Wav core's facade API), in the stage's default voice unless one is given.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from vllm_omni_token2wav.model_executor.layers.flow import ConformerTrim, Lookahead
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.family import MINICPMO_4_5
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_token2wav import MiniCPMO45Token2WavCore
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.variants import MiniCPMOVariant
from vllm_omni_token2wav.model_executor.models.token2wav_core.core import PromptWav
from vllm_omni_token2wav.model_executor.models.token2wav_core.prompt_features import PromptFeatures
from vllm_omni_token2wav.model_executor.models.token2wav_core.stage import CoreStageModel
from vllm_omni_token2wav.model_executor.models.token2wav_core.stream import (
    CHUNK_TOKENS,
    PRE_LOOKAHEAD_TOKENS,
    Token2WavStream,
    stream_chunks,
)
from vllm_omni_token2wav.model_executor.models.token2wav_core.stream_vocoder import VocoderKind
from vllm_omni_token2wav.model_executor.models.token2wav_core.synthesis import SpeechTokens
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import FamilySpec
from vllm_omni_token2wav.model_executor.models.token2wav_stage.options import StageOptions
from vllm_omni_token2wav.model_executor.models.token2wav_stage.voice import VOICE_SAMPLE_RATE, normalize_reference


class MiniCPMO45Code2Wav(CoreStageModel):
    """Stage-2 Token2Wav of MiniCPM-o 4.5 (see the module docstring)."""

    family: ClassVar[FamilySpec] = MINICPMO_4_5
    core_class: ClassVar[type[MiniCPMO45Token2WavCore]] = MiniCPMO45Token2WavCore

    def __init__(self, *, vllm_config: Any = None, prefix: str = "", **overrides: Any) -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, **overrides)
        self._reference: tuple[np.ndarray, int] | None = None

    def stream_rules(self, opts: StageOptions) -> tuple[Lookahead, ConformerTrim, VocoderKind]:
        self.variant = MiniCPMOVariant.parse(opts.variant)
        return self.variant.lookahead, self.variant.conformer_trim, self.variant.vocoder

    @property
    def reference(self) -> tuple[np.ndarray, int]:
        """The default voice normalised like every request's (24 kHz mono, `reference_seconds` long)."""
        if self._reference is None:
            wav = normalize_reference(self.default_voice, self.options.reference_seconds)
            self._reference = (wav, VOICE_SAMPLE_RATE)
        return self._reference

    def _voice(self, prompt_wav: PromptWav | None) -> PromptWav:
        if prompt_wav is None:
            return self.reference
        return (normalize_reference(prompt_wav, self.options.reference_seconds), VOICE_SAMPLE_RATE)

    def prompt_features(self, prompt_wav: PromptWav | None = None) -> PromptFeatures:
        """Speaker-path prompt features of `prompt_wav` (normalised), or of the default voice when None."""
        return self.token2wav.prepare_prompt(self._voice(prompt_wav))

    def start_stream(self, prompt_wav: PromptWav | None = None, *, seed: int | None = None) -> Token2WavStream:
        """One request's stream state in the voice of `prompt_wav` (default: the stage's default voice)."""
        return self.token2wav.set_stream_cache(self._voice(prompt_wav), seed=seed)

    def stream(self, state: Token2WavStream, codes: SpeechTokens, last_chunk: bool = False) -> torch.Tensor:
        """New audio `[1, N]` float32 of one chunk (25 codes + 3 lookahead, or the final rest)."""
        out = self.token2wav.stream(codes, None, last_chunk, True, state=state)
        assert isinstance(out, torch.Tensor)
        return out

    def synthesize(self, codes: SpeechTokens, prompt_wav: PromptWav | None = None) -> torch.Tensor:
        """The whole reply's waveform `[1, 960 * len(codes)]`, streamed in 25 + 3 token chunks as MiniCPM-o does."""
        state = self.start_stream(prompt_wav)
        pieces = [
            self.stream(state, chunk, last) for chunk, last in stream_chunks(codes, CHUNK_TOKENS, PRE_LOOKAHEAD_TOKENS)
        ]
        return torch.cat(pieces, dim=1)


__all__ = ["MiniCPMO45Code2Wav"]
