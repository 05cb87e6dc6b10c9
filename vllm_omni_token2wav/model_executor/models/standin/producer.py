# SPDX-License-Identifier: Apache-2.0
"""`Token2WavStandinProducer`: a tiny AR model that emits a deterministic codec-token stream.

The engine tests and `bench token2wav-serve --engine` need a real autoregressive stage in front of
the code2wav stage (vLLM's AR scheduler, KV cache, sampler and vLLM-Omni's async-chunk transfer),
but no real talker fits on a 2-core CI machine. This is vLLM's `Qwen2ForCausalLM` at toy size with
random (`load_format: dummy`) weights, whose logits are forced: the hidden state computed by the
real layers is discarded and the next token is `standin.codes.forced_next` of the current token
and position, as one-hot logits. Any sampler settings then pick that token, so each request's codes
are a pure function of its prompt (`standin.codes.expected_codes`), computable by a test.

The model folder's `config.json` (`standin/model_dirs.py`) carries `token2wav_standin.codec_offset`:
151696 for Step-Audio2 (audio tokens follow the text vocabulary; upstream's async-chunk function
subtracts it), 0 for CosyVoice3 (codec ids are the token ids). The hidden size must give a head
dimension vLLM's CPU attention supports (64).

This module imports vLLM at the top: only the engine imports it (through the plugin's registry).
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM

from vllm_omni_token2wav.model_executor.models.standin.codes import forced_next

CONFIG_KEY = "token2wav_standin"


class Token2WavStandinProducer(Qwen2ForCausalLM):
    """See the module docstring."""

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        settings = getattr(self.config, CONFIG_KEY, None) or {}
        self.codec_offset = int(settings.get("codec_offset", 0))
        if self.codec_offset + 6561 > self.config.vocab_size:
            raise ValueError(
                f"Token2WavStandinProducer: vocab_size {self.config.vocab_size} cannot hold codec ids "
                f"{self.codec_offset}..{self.codec_offset + 6560} ({CONFIG_KEY}.codec_offset)"
            )

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        hidden = super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)
        if input_ids is None:  # profiling with embeddings only: nothing to force
            return hidden
        forced = hidden.new_zeros(hidden.shape)
        # The forced token id rides in channel 0; float32 holds every id < 2**24 exactly.
        forced[:, 0] = forced_next(input_ids.reshape(-1), positions.reshape(-1), self.codec_offset).to(hidden.dtype)
        return forced

    def compute_logits(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        ids = hidden_states[:, 0].round().to(torch.int64).clamp_(0, self.config.vocab_size - 1)
        logits = torch.full(
            (hidden_states.shape[0], self.config.vocab_size), -1e4, dtype=torch.float32, device=hidden_states.device
        )
        logits.scatter_(1, ids[:, None], 0.0)
        return logits


__all__ = ["CONFIG_KEY", "Token2WavStandinProducer"]
