# SPDX-License-Identifier: Apache-2.0
"""Speech tokens + prompt -> mel frames: the top flow module of `flow.yaml` / `flow.pt`.

Equivalent of the reference `CausalMaskedDiffWithXvec` (key names `input_embedding`, `spk_embed_affine_layer`,
`encoder.*`, `encoder_proj`, `decoder.estimator.*`; 605 tensors, 155,802,352 parameters at the
real config). Two ways to run it:

- `inference(...)`: whole utterance. Tokens = [prompt | generated] -> encoder (bidirectional) -> `mu`;
  the CFM conditions on the prompt mel in the first P frames and returns the frames after the prompt.
- `setup_cache(...)` once per prompt, then `inference_chunk(...)` per chunk of tokens (+3 lookahead):
  causal across chunks, so its output is not equal to `inference`'s (each is tested against its own
  reference semantics). See `streaming.py` for the cache contract and the variants.

Token ids: `inference` clamps negative ids to 0 (the reference's padding convention) and rejects ids
>= vocab_size; the streaming path has no clamp in the reference, so any id outside [0, vocab_size) is
rejected. All entry points take batch 1 (the reference asserts it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.layers.flow.cfm import CausalConditionalCFM
from vllm_omni_token2wav.model_executor.layers.flow.checks import (
    check_length,
    mel_frames,
    speaker_embedding,
    speech_tokens,
)
from vllm_omni_token2wav.model_executor.layers.flow.encoder import UpsampleConformerEncoderV2
from vllm_omni_token2wav.model_executor.layers.flow.streaming import (
    CACHE_TAIL_FRAMES,
    ConformerTrim,
    FlowStreamCache,
    Lookahead,
    trim_conformer_cache,
    trim_time,
    with_lookahead,
)

logger = init_logger(__name__)


class CausalMaskedDiffWithXvec(nn.Module):
    def __init__(
        self,
        input_size: int = 512,
        output_size: int = 80,
        spk_embed_dim: int = 192,
        output_type: str = "mel",
        vocab_size: int = 5121,
        encoder: UpsampleConformerEncoderV2 | None = None,
        decoder: CausalConditionalCFM | None = None,
        input_embedding: nn.Module | None = None,
        *,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if encoder is None or decoder is None:
            raise ValueError("CausalMaskedDiffWithXvec: encoder and decoder are required (flow.yaml builds both)")
        if output_type != "mel":
            raise ValueError(f"CausalMaskedDiffWithXvec: output_type={output_type!r} is not supported (only 'mel')")
        self.input_size = input_size
        self.output_size = output_size
        self.spk_embed_dim = spk_embed_dim
        self.vocab_size = vocab_size
        self.output_type = output_type
        self.pre_lookahead_len = int(encoder.pre_lookahead_layer.pre_lookahead_len)
        self.up_rate = int(encoder.up_layer.stride)
        self.input_embedding = (
            input_embedding if input_embedding is not None else nn.Embedding(vocab_size, input_size, dtype=dtype)
        )
        self.spk_embed_affine_layer = nn.Linear(spk_embed_dim, output_size, dtype=dtype)
        self.encoder = encoder
        self.encoder_proj = nn.Linear(encoder.output_size(), output_size, dtype=dtype)
        self.decoder = decoder

    # ------------------------------------------------------------------ helpers
    @property
    def dtype(self) -> torch.dtype:
        return self.spk_embed_affine_layer.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.spk_embed_affine_layer.weight.device

    def project_speaker(self, spk: torch.Tensor, where: str) -> torch.Tensor:
        """The estimator's speaker input `[B, 80]` for CAM++ embeddings `[B, 192]` (L2-normalised, affine);
        `where` names the caller in shape errors."""
        spk = speaker_embedding(spk, where, dims=self.spk_embed_dim, device=self.device, dtype=self.dtype)
        return self.spk_embed_affine_layer(F.normalize(spk, dim=1))

    def _tokens(self, tokens: torch.Tensor, name: str, where: str, *, clamp_negative: bool) -> torch.Tensor:
        return speech_tokens(
            tokens, name, where, vocab_size=self.vocab_size, device=self.device, clamp_negative=clamp_negative
        )

    def _mel(self, mel: torch.Tensor, name: str, where: str) -> torch.Tensor:
        return mel_frames(mel, name, where, bins=self.output_size, device=self.device, dtype=self.dtype)

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
        n_timesteps: int = 10,
    ) -> torch.Tensor:
        """Mel `(1, 80, up * T)` of the generated tokens `(1, T)` in the voice of the prompt.

        The `*_len` arguments (reference-style, checked against the tensors) may be host ints: a
        length tensor on an accelerator is read back for the check, which waits for the device.

        `prompt_feat (1, P, 80)` must hold exactly `up_rate * prompt tokens` frames (the facades
        replicate-pad the 24 kHz prompt mel to that length, as upstream).
        """
        mu, cond, spk, p = self.whole_inputs(
            token, token_len, prompt_token, prompt_token_len, prompt_feat, prompt_feat_len, embedding, "inference"
        )
        mask = torch.ones(1, 1, mu.size(2), device=self.device, dtype=mu.dtype)
        feat = self.decoder(mu=mu, mask=mask, spks=spk, cond=cond, n_timesteps=n_timesteps)
        return feat[:, :, p:]

    def whole_inputs(
        self,
        token: torch.Tensor,
        token_len: torch.Tensor | int,
        prompt_token: torch.Tensor,
        prompt_token_len: torch.Tensor | int,
        prompt_feat: torch.Tensor,
        prompt_feat_len: torch.Tensor | int,
        embedding: torch.Tensor,
        where: str,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """The CFM's inputs of one whole utterance, checked (`where` names the caller in errors): mu and cond
        `(1, 80, T)` over [prompt | generated], the projected speaker `(1, 80)` and the prompt's frames P."""
        token = self._tokens(token, "tokens", where, clamp_negative=True)
        prompt_token = self._tokens(prompt_token, "prompt_tokens", where, clamp_negative=True)
        prompt_feat = self._mel(prompt_feat, "prompt_mel", where)
        check_length("token_len", token_len, token.size(1), where)
        check_length("prompt_token_len", prompt_token_len, prompt_token.size(1), where)
        check_length("prompt_mel_len", prompt_feat_len, prompt_feat.size(1), where)
        if token.size(1) == 0:
            raise ValueError(f"flow.{where}: no generated tokens")
        if prompt_feat.size(1) != self.up_rate * prompt_token.size(1):
            raise ValueError(
                f"flow.{where}: prompt_mel has {prompt_feat.size(1)} frames but {prompt_token.size(1)} prompt tokens "
                f"need {self.up_rate * prompt_token.size(1)} (x{self.up_rate}); replicate-pad or trim the prompt mel"
            )
        spk = self.project_speaker(embedding, where)

        tokens = torch.cat([prompt_token, token], dim=1)
        lens = torch.tensor([tokens.size(1)]).to(self.device, non_blocking=True)
        h, _ = self.encoder(self.input_embedding(tokens), lens)
        h = self.encoder_proj(h)
        p = prompt_feat.size(1)
        conds = torch.zeros_like(h)
        conds[:, :p] = prompt_feat
        return h.transpose(1, 2).contiguous(), conds.transpose(1, 2).contiguous(), spk, int(p)

    # ------------------------------------------------------------------ streaming
    @torch.inference_mode()
    def setup_cache(
        self,
        token: torch.Tensor,
        mel: torch.Tensor,
        spk: torch.Tensor,
        n_timesteps: int = 10,
        *,
        lookahead: Lookahead = Lookahead.INCLUDED,
        conformer_trim: ConformerTrim = ConformerTrim.NONE,
        tail_frames: int = CACHE_TAIL_FRAMES,
    ) -> FlowStreamCache:
        """Run the prompt through encoder and estimator once and keep only their caches.

        token `(1, T)`: prompt tokens, followed by `pre_lookahead_len` lookahead tokens unless
        `lookahead` says which to append; mel `(1, P, 80)` with `P == up_rate * (T - lookahead)`.
        """
        where = "setup_cache"
        token = self._tokens(token, "prompt tokens", where, clamp_negative=False)
        token = with_lookahead(token, lookahead, self.pre_lookahead_len)
        mel = self._mel(mel, "prompt_mel", where)
        if (token.size(1) - self.pre_lookahead_len) * self.up_rate != mel.size(1):
            raise ValueError(
                f"flow.setup_cache: {token.size(1)} tokens including {self.pre_lookahead_len} lookahead need "
                f"{(token.size(1) - self.pre_lookahead_len) * self.up_rate} prompt mel frames, got {mel.size(1)}; "
                "did you forget the lookahead tokens (pass lookahead=Lookahead.PROMPT_HEAD or SILENCE)?"
            )
        if mel.size(1) < 2:
            raise ValueError("flow.setup_cache: the prompt must hold at least one token (2 mel frames)")
        spk_p = self.project_speaker(spk, where)
        h, cnn, att = self.encoder.forward_chunk(self.input_embedding(token), False, None, None)
        h = self.encoder_proj(h)
        _, est_cnn, est_att = self.decoder.forward_chunk(
            mu=h.transpose(1, 2).contiguous(),
            spks=spk_p,
            cond=mel.transpose(1, 2).contiguous(),
            n_timesteps=n_timesteps,
            cnn_cache=None,
            att_cache=None,
        )
        return FlowStreamCache(
            conformer_cnn_cache=cnn,
            conformer_att_cache=att,
            estimator_cnn_cache=est_cnn,
            estimator_att_cache=est_att,
            prompt_frames=mel.size(1),
            n_timesteps=n_timesteps,
            conformer_trim=conformer_trim,
            tail_frames=tail_frames,
        )

    @torch.inference_mode()
    def inference_chunk(
        self,
        token: torch.Tensor,
        spk: torch.Tensor,
        cache: FlowStreamCache,
        last_chunk: bool = False,
        n_timesteps: int = 10,
    ) -> tuple[torch.Tensor, FlowStreamCache]:
        """Mel `(1, 80, up * T')` of one chunk and the next cache (the input cache is not modified).

        token `(1, T)`: the chunk's tokens followed by `pre_lookahead_len` lookahead tokens
        (T' = T - 3), or for the last chunk just its tokens (T' = T, zero-padded lookahead).
        """
        where = "inference_chunk"
        if not isinstance(cache, FlowStreamCache):
            raise TypeError(
                f"flow.inference_chunk: cache must be a FlowStreamCache from setup_cache, got {type(cache)}"
            )
        if n_timesteps != cache.n_timesteps:
            raise ValueError(
                f"flow.inference_chunk: n_timesteps={n_timesteps} but the cache was set up with {cache.n_timesteps}"
            )
        token = self._tokens(token, "tokens", where, clamp_negative=False)
        emitted = token.size(1) if last_chunk else token.size(1) - self.pre_lookahead_len
        if emitted < (1 if last_chunk else 2):
            raise ValueError(
                f"flow.inference_chunk: {token.size(1)} tokens; a non-final chunk needs at least 2 tokens plus "
                f"{self.pre_lookahead_len} lookahead tokens, a final chunk at least 1 token"
            )
        spk_p = self.project_speaker(spk, where)
        h, cnn, att = self.encoder.forward_chunk(
            self.input_embedding(token), last_chunk, cache.conformer_cnn_cache, cache.conformer_att_cache
        )
        h = self.encoder_proj(h)
        mu = h.transpose(1, 2).contiguous()
        feat, est_cnn, est_att = self.decoder.forward_chunk(
            mu=mu,
            spks=spk_p,
            cond=torch.zeros_like(mu),
            n_timesteps=n_timesteps,
            cnn_cache=cache.estimator_cnn_cache,
            att_cache=cache.estimator_att_cache,
        )
        p, tail = cache.prompt_frames, cache.tail_frames
        est_att = trim_time(est_att, 4, p, tail)
        att = trim_conformer_cache(
            att, cache.conformer_trim, p, tail, token_layers=len(self.encoder.encoders), stride=self.up_rate
        )
        new_cache = FlowStreamCache(
            conformer_cnn_cache=cnn,
            conformer_att_cache=att,
            estimator_cnn_cache=est_cnn,
            estimator_att_cache=est_att,
            prompt_frames=p,
            n_timesteps=n_timesteps,
            conformer_trim=cache.conformer_trim,
            tail_frames=tail,
        )
        return feat, new_cache
