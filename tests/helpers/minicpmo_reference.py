# SPDX-License-Identifier: Apache-2.0
"""minicpmo-utils 1.0.7's streaming `Token2wav`, restated for the tests from module-level pieces.

What the package's `set_stream_cache` / `stream` / `_stream_vocode` / `_trim_*` do, written from
its description (stepaudio2/token2wav.py, read for facts), not from the in-tree variant code:

- set-up: `flow.setup_cache(cat([prompt_tokens, prompt_tokens[:, :3]]), prompt_mel, spk)`;
- each call: `flow.inference_chunk(...)` on the untrimmed cache, then the estimator trim
  (`[:P]` + `[-100:]`, done by `inference_chunk` itself here) and the conformer trim restated in
  `minicpmo_1_0_7_conformer_trim` (explicit index lists);
- the vocoder: a bounded causal-HiFT stream (block 16, float64 phase, lag 8) WITHOUT its leading
  zeros, and the zeros rule of `_stream_vocode` applied here: 3840 zeros before the first non-empty
  output unless that call is the last one; an empty last call only flushes the vocoder.

The vocoder stream itself is the in-tree `CausalHiFTStreamer` (tested against a restated reference
vocoder in tests/model_executor/layers/hift_causal/), loaded from the directory's `hift.pt` with
the noise table of `config.yaml`'s seed (1986 in the stand-ins; the table origin is tested in
test_noise.py / test_yaml_config.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import torch

from vllm_omni_token2wav.model_executor.layers.flow import CausalMaskedDiffWithXvec, Lookahead, load_flow
from vllm_omni_token2wav.model_executor.layers.hift_causal import (
    MINICPMO_1_0_7_STREAM,
    CausalHiFTStreamer,
    NoiseOrigin,
    load_causal_hift,
)
from vllm_omni_token2wav.model_executor.models.token2wav_core.prompt_features import PromptFeatures

LEADING_ZEROS = 3840
CONFIG_SEED = 1986  # the stand-in config.yaml's torch.manual_seed


def minicpmo_1_0_7_conformer_trim(cache: torch.Tensor, prompt_frames: int, token_layers: int) -> torch.Tensor:
    """`Token2wav._trim_conformer_cache` with explicit index lists.

    Above P + 100 frames: each token-rate layer (stored [c, c]) keeps tokens 0 .. P/2 - 1 and its last
    50 tokens, stored tiled again; each mel-rate layer keeps frames 0 .. P - 1 and its last 100.
    """
    length = cache.shape[3]
    if length <= prompt_frames + 100:
        return cache
    tokens = length // 2
    keep_tokens = list(range(prompt_frames // 2)) + list(range(tokens - 50, tokens))
    keep_frames = list(range(prompt_frames)) + list(range(length - 100, length))
    layers = []
    for layer in range(cache.shape[0]):
        if layer < token_layers:
            kept = cache[layer][:, :, keep_tokens]
            layers.append(torch.cat([kept, kept], dim=2))
        else:
            layers.append(cache[layer][:, :, keep_frames])
    return torch.stack(layers)


class MiniCPMOReferenceStream:
    """One stream of the restated 1.0.7 `Token2wav` over a token2wav directory in its layout."""

    def __init__(self, model_dir: Path, features: PromptFeatures, *, n_timesteps: int) -> None:
        self.flow: CausalMaskedDiffWithXvec = load_flow((model_dir / "flow.yaml", model_dir / "flow.pt"), device="cpu")
        hift = load_causal_hift(
            model_dir / "hift.pt", device="cpu", noise=lambda cfg: NoiseOrigin.vocoder_yaml(cfg, CONFIG_SEED)
        )
        silent = dataclasses.replace(MINICPMO_1_0_7_STREAM, name="no-zeros", leading_silence_samples=0)
        self.vocoder = CausalHiFTStreamer(hift, silent)
        assert features.prompt_tokens is not None
        tokens = features.prompt_tokens.to(torch.long)
        self.prompt_frames = int(features.prompt_mel.shape[1])
        self.spk = features.speaker_embedding
        self.n_timesteps = n_timesteps
        self.cache = self.flow.setup_cache(
            torch.cat([tokens, tokens[:, :3]], dim=1),
            features.prompt_mel,
            self.spk,
            n_timesteps,
            lookahead=Lookahead.INCLUDED,
        )
        self.state = self.vocoder.start()
        self.first_chunk = True

    def stream(self, tokens: Sequence[int], last_chunk: bool) -> torch.Tensor:
        """The new audio [1, n] of one call, as `Token2wav.stream(tokens, last_chunk=...)` returns it."""
        if tokens:
            ids = torch.tensor([list(tokens)], dtype=torch.long)
            mel, cache = self.flow.inference_chunk(ids, self.spk, self.cache, last_chunk, self.n_timesteps)
            trimmed = minicpmo_1_0_7_conformer_trim(
                cache.conformer_att_cache, self.prompt_frames, len(self.flow.encoder.encoders)
            )
            self.cache = dataclasses.replace(cache, conformer_att_cache=trimmed)
        else:
            mel = torch.zeros(1, 80, 0)
        speech, self.state = self.vocoder.push(self.state, mel, finalize=last_chunk)
        if speech.shape[-1] and self.first_chunk:
            self.first_chunk = False
            if not last_chunk:
                speech = torch.cat([speech.new_zeros(1, LEADING_ZEROS), speech], dim=1)
        return speech


__all__ = ["CONFIG_SEED", "LEADING_ZEROS", "MiniCPMOReferenceStream", "minicpmo_1_0_7_conformer_trim"]
