# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3's causal HiFT vocoder (`CausalHiFTGenerator`): 80-bin 50 Hz mel -> 24 kHz waveform.

The HiFT of `cosyvoice2.hift` made causal, as in the reference (CosyVoice `hifigan/generator.py`,
`CausalHiFTGenerator`, at ace7c47): module names and shapes follow Fun-CosyVoice3's `hift.pt`
(328 keys, 20,779,887 parameters), so it loads strictly through the shared HiFT loader.

| part          | HiFT (non-causal)                     | causal HiFT (this module)                           |
|---------------|---------------------------------------|-----------------------------------------------------|
| conv_pre      | k7, centred                           | k5 reading the frame + 4 future ones                |
| ups[i]        | ConvTranspose1d(k, stride u)          | nearest x u, then Conv1d(k) over the past (k - 1)   |
| source_downs  | Conv1d(2u, stride u, pad u/2)         | the same conv, left pad u - 1                       |
| ResBlocks     | centred                               | left pad (k - 1) d                                  |
| conv_post     | k7, centred                           | k7, left pad 6                                      |
| F0 predictor  | 5 x k3 centred                        | k4 reading 3 future frames, then 4 x k3 left pad 2, |
|               |                                       | run in float64 (the reference casts it per call)    |
| source        | random phase, Gaussian noise per call | nearest-held sines, fixed uniform table (`noise`)   |

Kernels for streaming (`stream.py` drives them chunk by chunk; `inference` runs one chunk over a
whole utterance): `predict_f0` (mel -> F0 frames), `m_source` (F0 frames -> excitation samples,
`source.py`) and `decode` (mel + source STFT frames -> conv_post frames). Every causal conv reads
its left context from a `ContextCarry`, so a chunk costs only its own frames.

The F0 predictor stays float64 on whatever the model is moved or cast to (`_apply`): its weights
are folded from the float32 checkpoint in float64, as the reference computes them, and casting
them to float32 would lose that. `f0_device` pins it to another device (the loader puts it on the
CPU on NPU hosts, where float64 convolutions are not available).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from vllm_omni_token2wav.model_executor.layers.hift.causal_conv import (
    CausalConv1d,
    CausalUpsampleConv1d,
    ContextCarry,
    LookaheadConv1d,
    assign_carry_keys,
)
from vllm_omni_token2wav.model_executor.layers.hift.layers import HiFTBase
from vllm_omni_token2wav.model_executor.layers.hift_causal.config import FULL_CAUSAL_HIFT_CONFIG, CausalHiFTConfig
from vllm_omni_token2wav.model_executor.layers.hift_causal.noise import GeneratedNoiseTable, NoiseTable
from vllm_omni_token2wav.model_executor.layers.hift_causal.source import CausalSource
from vllm_omni_token2wav.model_executor.layers.hift_causal.stream import COSYVOICE3_STREAM, CausalHiFTStreamer


class CausalHiFTGenerator(HiFTBase):
    """Causal 24 kHz HiFT; `inference(mel, finalize)` as the reference, `stream.CausalHiFTStreamer` per chunk."""

    config: CausalHiFTConfig
    conv_pre: LookaheadConv1d
    conv_post: CausalConv1d

    def __init__(
        self,
        config: CausalHiFTConfig = FULL_CAUSAL_HIFT_CONFIG,
        *,
        dtype: torch.dtype = torch.float32,
        noise: NoiseTable | None = None,
    ) -> None:
        super().__init__(config, causal=True, dtype=dtype, f0_dtype=torch.float64)
        cfg = config
        self.m_source = CausalSource(cfg, dtype=dtype)
        self.conv_pre = LookaheadConv1d(cfg.in_channels, cfg.base_channels, cfg.conv_pre_look_right + 1, dtype=dtype)
        self.ups = nn.ModuleList(
            CausalUpsampleConv1d(cfg.base_channels // (2**i), cfg.stage_channels(i), k, u, dtype=dtype)
            for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes, strict=True))
        )
        self.source_downs = nn.ModuleList(
            CausalConv1d(cfg.stft_channels, cfg.stage_channels(i), 1, dtype=dtype)
            if rate == 1
            else CausalConv1d(cfg.stft_channels, cfg.stage_channels(i), rate * 2, rate, dtype=dtype)
            for i, rate in enumerate(self.source_down_rates(cfg))
        )
        self.conv_post = CausalConv1d(cfg.stage_channels(len(self.ups) - 1), cfg.stft_channels, 7, dtype=dtype)
        self.reflection_pad = nn.ReflectionPad1d((1, 0))
        assign_carry_keys(self)
        # Not a buffer: the reference's tables are plain attributes, never in hift.pt.
        self.noise: NoiseTable = GeneratedNoiseTable.for_config(cfg) if noise is None else noise
        self.f0_device: torch.device | None = None

    # -- placement ---------------------------------------------------------------------------------

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> CausalHiFTGenerator:
        """Move/cast like nn.Module, except the F0 predictor: float64 always, on `f0_device` when set."""
        predictor = self._modules["f0_predictor"]
        assert predictor is not None
        # Where would `fn` put a float64 tensor of the predictor? Keep only the device of the answer.
        probe = fn(torch.zeros((), dtype=torch.float64, device=predictor.classifier.weight.device))
        target = self.f0_device if self.f0_device is not None else probe.device
        self._modules["f0_predictor"] = nn.Identity()  # placeholder keeps the module order
        try:
            super()._apply(fn, recurse)
        finally:
            self._modules["f0_predictor"] = predictor
        predictor.to(device=target, dtype=torch.float64)
        return self

    def place_f0_predictor(self, device: torch.device | str | None) -> CausalHiFTGenerator:
        """Pin the F0 predictor (and the frame-level source math) to `device`; None follows the model."""
        self.f0_device = None if device is None else torch.device(device)
        self.f0_predictor.to(device=self.f0_device or self.conv_pre.weight.device, dtype=torch.float64)
        return self

    @property
    def device(self) -> torch.device:
        return self.conv_pre.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.conv_pre.weight.dtype

    @property
    def predictor_device(self) -> torch.device:
        """Where the F0 predictor, the phase and the frame-level sines are computed."""
        return self.f0_predictor.classifier.weight.device

    # -- kernels -----------------------------------------------------------------------------------

    def predict_f0(self, mel: torch.Tensor, carry: ContextCarry | None, finalize: bool) -> torch.Tensor:
        """mel [B, 80, n] -> F0 [B, n] (finalize) or [B, n - 3] in the model dtype, on the predictor's device.

        Runs in float64 like the reference's `inference` (`f0_predictor.to(torch.float64)`), then
        rounds to the model dtype (`.to(speech_feat)`), where the sine phase is computed.
        """
        f0 = self.f0_predictor(mel.to(device=self.predictor_device, dtype=torch.float64), carry, finalize)
        return f0.to(self.dtype)

    def decode(
        self,
        mel: torch.Tensor,
        source_stft: torch.Tensor,
        carry: ContextCarry | None,
        *,
        first: bool,
        finalize: bool,
    ) -> torch.Tensor:
        """mel frames + the excitation's STFT frames of the same span -> conv_post frames (pre-iSTFT).

        `mel` [B, 80, n + 4] holds 4 look-ahead frames unless `finalize` (then zeros follow it);
        for d = n decoded frames `source_stft` must hold 120 d STFT frames (120 d + 1 when `first`,
        the chunk that starts the signal, where the reflection pad adds the frame at t = 0).
        Returns [B, 18, 120 d (+ 1)].
        """
        x = self.conv_pre(mel, finalize)
        last = len(self.ups) - 1
        for i, up in enumerate(self.ups):
            x = F.leaky_relu(x, self.config.lrelu_slope)
            x = up(x, carry)
            if i == last and first:
                x = self.reflection_pad(x)
            x = self.fuse(i, x, self.source_downs[i](source_stft, carry), carry)
        return self.conv_post(F.leaky_relu(x), carry)

    # -- whole utterance ---------------------------------------------------------------------------

    def inference(self, mel: torch.Tensor, finalize: bool = True) -> torch.Tensor:
        """Vocode `mel` [B, 80, T] as the reference's `CausalHiFTGenerator.inference` does.

        finalize=True: the whole utterance, 480 T samples. finalize=False: the last 3 frames only
        feed the F0 predictor, the 4 before them only conv_pre, and the last 480 samples are dropped:
        480 (T - 8) samples, equal to the first ones of the finalized output (none for T <= 8,
        where the reference fails). Returns [B, samples].
        """
        self.check_mel(mel)
        streamer = CausalHiFTStreamer(self, COSYVOICE3_STREAM)
        audio, _ = streamer.push(streamer.start(mel.shape[0]), mel, finalize=finalize)
        return audio

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """Whole-utterance vocoding: `inference(mel, finalize=True)`."""
        return self.inference(mel, finalize=True)
