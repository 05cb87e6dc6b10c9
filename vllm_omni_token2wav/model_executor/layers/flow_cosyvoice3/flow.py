# SPDX-License-Identifier: Apache-2.0
"""Speech tokens + prompt -> mel: CosyVoice3's flow `CausalMaskedDiffWithDiT` (the top module of `flow.pt`).

Keys: `input_embedding` (6561 x 80), `spk_embed_affine_layer` (192 -> 80), `pre_lookahead_layer.conv{1,2}`
(80 -> 1024 -> 80, kernels 4 and 3) and `decoder.estimator.*` (the DiT): 330 tensors, 332,257,088
parameters at full size. There is no conformer encoder: the token features are the embedding through
the pre-lookahead layer, repeated `token_mel_ratio` (2) times to the 50 Hz mel rate (mu).

`inference(...)` mirrors the reference call (`streaming`, `finalize`, batch 1):
- tokens = [prompt | generated], ids clamped at 0 (the reference's padding convention), >= vocab rejected;
- `finalize=True`: the pre-lookahead layer sees zeros after the last token; `finalize=False`: the last
  `pre_lookahead_len` (3) tokens are only lookahead context and the mel covers the tokens before them;
- cond = the prompt mel in the first 2P frames, zeros after; noise = the table's columns 0..T-1;
- `streaming=False`: full attention; `streaming=True`: block-causal 50-frame chunks;
- returns the mel frames after the prompt, float32.

Streaming at constant cost (`start_stream` / `stream_chunk`) lives in `streaming.py`; it returns, per
chunk, what a `streaming=True, finalize=False` re-run of the whole prefix returns for the new frames.
The prompt must be aligned 2:1 first (`align_prompt`, the reference front end's truncation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vllm_omni_token2wav.model_executor.layers.flow.checks import (
    check_length,
    mel_frames,
    speaker_embedding,
    speech_tokens,
)
from vllm_omni_token2wav.model_executor.layers.flow.pre_lookahead import PreLookaheadLayer
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.cfm import CausalConditionalCFM
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.config import REAL_FLOW_CONFIG, CosyVoice3FlowConfig
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.dit import DiT
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.noise import (
    UPSTREAM_NOISE_SEED,
    check_noise,
    noise_table,
)


def align_prompt(
    prompt_tokens: torch.Tensor, prompt_mel: torch.Tensor, token_mel_ratio: int = 2
) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncate a prompt to `n = min(mel frames // ratio, tokens)` tokens and `ratio * n` mel frames.

    The reference front end does this for 24 kHz models (CosyVoice2/3): the prompt's speech tokens and
    its mel come from different feature extractors and can disagree by a frame or two. Truncation,
    never padding. prompt_tokens `(1, T)`, prompt_mel `(1, F, 80)`.
    """
    n = min(prompt_mel.size(1) // token_mel_ratio, prompt_tokens.size(1))
    return prompt_tokens[:, :n], prompt_mel[:, : token_mel_ratio * n]


class CausalMaskedDiffWithDiT(nn.Module):
    def __init__(self, config: CosyVoice3FlowConfig = REAL_FLOW_CONFIG, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        c = config
        self.config = c
        self.input_embedding = nn.Embedding(c.vocab_size, c.input_size, dtype=dtype)
        self.spk_embed_affine_layer = nn.Linear(c.spk_embed_dim, c.output_size, dtype=dtype)
        self.pre_lookahead_layer = PreLookaheadLayer(
            c.pre_lookahead_channels, c.pre_lookahead_len, in_channels=c.input_size, dtype=dtype
        )
        self.decoder = CausalConditionalCFM(DiT(c, dtype=dtype), c.inference_cfg_rate)

    # ------------------------------------------------------------------ pieces shared with streaming
    @property
    def dtype(self) -> torch.dtype:
        return self.spk_embed_affine_layer.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.spk_embed_affine_layer.weight.device

    @property
    def estimator(self) -> DiT:
        return self.decoder.estimator

    def speaker(self, embedding: torch.Tensor, where: str) -> torch.Tensor:
        """CAM++ embedding `(1, 192)` -> the estimator's speaker input `(1, 80)` (L2-normalised, projected)."""
        spk = speaker_embedding(embedding, where, dims=self.config.spk_embed_dim, device=self.device, dtype=self.dtype)
        return self.spk_embed_affine_layer(F.normalize(spk, dim=1))

    def tokens(self, tokens: torch.Tensor, name: str, where: str, *, clamp_negative: bool) -> torch.Tensor:
        return speech_tokens(
            tokens, name, where, vocab_size=self.config.vocab_size, device=self.device, clamp_negative=clamp_negative
        )

    def prompt_mel(self, mel: torch.Tensor, prompt_tokens: int, where: str) -> torch.Tensor:
        mel = mel_frames(mel, "prompt_mel", where, bins=self.config.output_size, device=self.device, dtype=self.dtype)
        want = self.config.token_mel_ratio * prompt_tokens
        if mel.size(1) != want:
            raise ValueError(
                f"flow.{where}: prompt_mel has {mel.size(1)} frames but {prompt_tokens} prompt tokens need {want} "
                f"(x{self.config.token_mel_ratio}); truncate both with align_prompt() as the reference front end does"
            )
        return mel

    def noise(self, seed: int, noise: torch.Tensor | None, frames: int, where: str) -> torch.Tensor:
        """The noise table to read (`noise` if given, else the cached table for `seed`), checked to hold `frames`."""
        if noise is None:
            noise = noise_table(seed, channels=self.config.output_size, device=self.device, dtype=self.dtype)
        check_noise(noise, self.config.output_size, frames, where)
        return noise.to(device=self.device, dtype=self.dtype)

    def mu(self, ids: torch.Tensor, *, history: int, lookahead_pad: int) -> torch.Tensor:
        """Token ids `(1, T)` (long, >= 0) -> mu `(1, 80, ratio * outputs)` through the pre-lookahead layer.

        The ids are `history` positions of left context, the output positions, then the real lookahead;
        `lookahead_pad` lookahead positions are missing (zeros, the utterance end).
        """
        h = self.pre_lookahead_layer.forward_window(
            self.input_embedding(ids), history=history, lookahead_pad=lookahead_pad
        )
        return h.repeat_interleave(self.config.token_mel_ratio, dim=1).transpose(1, 2)

    def solve(
        self,
        ids: torch.Tensor,
        prompt_mel: torch.Tensor,
        spk: torch.Tensor,
        noise: torch.Tensor,
        n_timesteps: int,
        *,
        streaming: bool,
        finalize: bool,
    ) -> torch.Tensor:
        """All frames `(1, 80, T)` of [prompt | generated] `ids` in one run (no checks; see `inference`)."""
        lookahead = self.config.pre_lookahead_len
        mu = self.mu(ids, history=0, lookahead_pad=lookahead if finalize else 0)
        frames = mu.size(2)
        cond = torch.zeros_like(mu)
        cond[:, :, : prompt_mel.size(1)] = prompt_mel.transpose(1, 2)
        mask = torch.ones(1, 1, frames, device=mu.device, dtype=mu.dtype)
        return self.decoder(noise[:, :, :frames], mu, mask, spk, cond, n_timesteps, streaming)

    # ------------------------------------------------------------------ whole utterance
    @torch.inference_mode()
    def inference(
        self,
        token: torch.Tensor,
        token_len: torch.Tensor | int,
        prompt_token: torch.Tensor,
        prompt_token_len: torch.Tensor | int,
        prompt_feat: torch.Tensor,
        prompt_feat_len: torch.Tensor | int,
        embedding: torch.Tensor,
        streaming: bool = False,
        finalize: bool = True,
        *,
        n_timesteps: int = 10,
        noise_seed: int = UPSTREAM_NOISE_SEED,
        noise: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Mel `(1, 80, 2 T')` of the generated tokens `(1, T)` after the prompt (T' = T, or T - 3 unless finalize).

        `noise_seed` picks the noise table (0 = upstream's); `noise` `(1, 80, N)` replaces it (e.g. a
        reference run's). `prompt_feat (1, 2P, 80)` must be aligned to the prompt tokens (`align_prompt`).
        """
        where = "inference"
        token = self.tokens(token, "tokens", where, clamp_negative=True)
        prompt_token = self.tokens(prompt_token, "prompt_tokens", where, clamp_negative=True)
        check_length("token_len", token_len, token.size(1), where)
        check_length("prompt_token_len", prompt_token_len, prompt_token.size(1), where)
        prompt_feat = self.prompt_mel(prompt_feat, prompt_token.size(1), where)
        check_length("prompt_mel_len", prompt_feat_len, prompt_feat.size(1), where)
        lookahead = self.config.pre_lookahead_len
        if token.size(1) == 0 or (not finalize and token.size(1) <= lookahead):
            raise ValueError(
                f"flow.inference: {token.size(1)} generated tokens; need at least 1 (finalize=True) or "
                f"{lookahead + 1} (finalize=False: the last {lookahead} are lookahead only)"
            )
        if n_timesteps < 1:
            raise ValueError(f"flow.inference: n_timesteps must be >= 1, got {n_timesteps}")
        ids = torch.cat([prompt_token, token], dim=1)
        frames = self.config.token_mel_ratio * (ids.size(1) - (0 if finalize else lookahead))
        table = self.noise(noise_seed, noise, frames, where)
        spk = self.speaker(embedding, where)
        feat = self.solve(ids, prompt_feat, spk, table, n_timesteps, streaming=streaming, finalize=finalize)
        return feat[:, :, prompt_feat.size(1) :].float()
