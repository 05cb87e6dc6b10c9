# SPDX-License-Identifier: Apache-2.0
"""HiFT generator: 80-bin 50 Hz mel -> 24 kHz waveform (NSF source + HiFi-GAN upsampler + iSTFT head).

The module names and parameter shapes follow the shipped `hift.pt` so its state_dict loads
strictly (328 keys, 20,821,295 parameters at full size). Weight-normalised convolutions are plain
`Conv1d`/`ConvTranspose1d` here: `load_hift` folds g * v / ||v|| into `weight` once at load time
(or, with `fold_weight_norm=False`, installs torch's weight-norm parametrisation instead), so the
inference path carries no per-call normalisation.

Signal path per call (`forward(mel, cache_source)`):
  f0 = |classifier(condnet(mel))|           (mel rate)          -> repeat 480x to the waveform rate
  source = tanh(l_linear(SineGen(f0)))      (waveform rate, [B, 1, 480 T])
  x = conv_pre(mel); for each stage: leaky_relu(0.1) -> ups[i] (+ reflection pad (1, 0) on the last)
      + source_resblocks[i](source_downs[i](STFT(source))) -> mean of 3 ResBlocks
  x = conv_post(leaky_relu(x, 0.01)); magnitude = min(exp(x[:9]), 100), phase = sin(x[9:])
  speech = clamp(iSTFT(magnitude, phase), +-0.99)   -> exactly 480 samples per mel frame
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vllm_omni.model_executor.models.cosyvoice2.hift.config import FULL_HIFT_CONFIG, HiFTConfig
from vllm_omni.model_executor.models.cosyvoice2.hift.layers import HiFTBase, istft_head, stft_channels
from vllm_omni.model_executor.models.cosyvoice2.hift.source import NoiseSource, SourceModuleHnNSF


class HiFTGenerator(HiFTBase):
    """The 24 kHz HiFT vocoder; `forward(mel, cache_source=None, generator=None) -> (speech, source)`."""

    def __init__(self, config: HiFTConfig = FULL_HIFT_CONFIG, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(config, causal=False, dtype=dtype, f0_dtype=dtype)
        cfg = config
        self.m_source = SourceModuleHnNSF(
            cfg.sampling_rate,
            cfg.upsample_scale,
            cfg.nb_harmonics,
            cfg.nsf_alpha,
            cfg.nsf_sigma,
            cfg.nsf_voiced_threshold,
            dtype=dtype,
        )
        self.conv_pre = nn.Conv1d(cfg.in_channels, cfg.base_channels, 7, 1, padding=3, dtype=dtype)
        self.ups = nn.ModuleList(
            nn.ConvTranspose1d(
                cfg.base_channels // (2**i), cfg.stage_channels(i), k, u, padding=(k - u) // 2, dtype=dtype
            )
            for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes, strict=True))
        )
        # Strides 15, 3, 1 take the source STFT frames (120 T + 1) to 8 T, 40 T, 120 T + 1.
        self.source_downs = nn.ModuleList(
            nn.Conv1d(cfg.stft_channels, cfg.stage_channels(i), 1, 1, dtype=dtype)
            if rate == 1
            else nn.Conv1d(cfg.stft_channels, cfg.stage_channels(i), rate * 2, rate, padding=rate // 2, dtype=dtype)
            for i, rate in enumerate(self.source_down_rates(cfg))
        )
        self.conv_post = nn.Conv1d(
            cfg.stage_channels(len(self.ups) - 1), cfg.stft_channels, 7, 1, padding=3, dtype=dtype
        )
        self.reflection_pad = nn.ReflectionPad1d((1, 0))

    def decode(self, mel: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """mel [B, 80, T], source [B, 1, 480 T] -> speech [B, 480 T]."""
        n_fft, hop = self.config.istft_n_fft, self.config.istft_hop
        source_stft = stft_channels(source.squeeze(1), n_fft, hop, self.stft_window)
        x = self.conv_pre(mel)
        for i, up in enumerate(self.ups):
            x = F.leaky_relu(x, self.config.lrelu_slope)
            x = up(x)
            if i == len(self.ups) - 1:
                x = self.reflection_pad(x)
            x = self.fuse(i, x, self.source_downs[i](source_stft))
        x = self.conv_post(F.leaky_relu(x))
        speech = istft_head(x, n_fft, hop, self.stft_window)
        return torch.clamp(speech, -self.config.audio_limit, self.config.audio_limit)

    def source(self, mel: torch.Tensor, generator: NoiseSource = None) -> torch.Tensor:
        """mel [B, 80, T] -> NSF excitation [B, 1, 480 T].

        With per-row generators (a batch of independent requests) F0 is predicted row by row: a
        batched convolution rounds differently from a batch-1 one (~1e-7 relative), and the sine
        source integrates the phase over the whole chunk (cumsum x 2 pi x 9 harmonics), which turns
        that into ~1e-4 differences in the excitation. Row by row, each row's source is its solo one.
        """
        if generator is not None and not isinstance(generator, torch.Generator) and mel.shape[0] > 1:
            f0 = torch.cat([self.f0_predictor(mel[i : i + 1]) for i in range(mel.shape[0])], dim=0)
        else:
            f0 = self.f0_predictor(mel)
        f0 = torch.repeat_interleave(f0, self.config.upsample_scale, dim=1)[..., None]  # nearest x480
        return self.m_source(f0, generator).transpose(1, 2)

    def forward(
        self,
        mel: torch.Tensor,
        cache_source: torch.Tensor | None = None,
        *,
        generator: NoiseSource = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Vocode `mel` [B, 80, T]; returns (speech [B, 480 T], source [B, 1, 480 T]).

        `cache_source` [B, 1, S] (S <= 480 T) overwrites the first S source samples: streaming
        passes the previous chunk's last source samples so the excitation stays phase-continuous
        across chunks. `generator` makes the source noise reproducible (default: torch's global RNG,
        as the reference does); it must live on `mel`'s device. A sequence of generators (one per row,
        `None` for padding rows) gives every row the noise of its own batch-1 call (`source.draw`);
        `source.DrawnNoise` is the same noise drawn ahead (`source.draw_ahead`, for captured calls).

        The same as `excitation` (the source, cached samples written in) followed by `decode`.
        """
        source = self.excitation(mel, cache_source, generator=generator)
        return self.decode(mel.to(self.conv_pre.weight.dtype), source), source

    def excitation(
        self,
        mel: torch.Tensor,
        cache_source: torch.Tensor | None = None,
        *,
        generator: NoiseSource = None,
    ) -> torch.Tensor:
        """The NSF source [B, 1, 480 T] of `mel`, its first S samples replaced by `cache_source` (see `forward`)."""
        self.check_mel(mel)
        mel = mel.to(self.conv_pre.weight.dtype)
        source = self.source(mel, generator)
        if cache_source is not None and cache_source.shape[-1] > 0:
            cache_len = cache_source.shape[-1]
            if cache_source.dim() != 3 or cache_source.shape[0] != mel.shape[0] or cache_source.shape[1] != 1:
                raise ValueError(
                    f"HiFT cache_source must be [B={mel.shape[0]}, 1, S], got {tuple(cache_source.shape)}; "
                    "pass the `source` returned by the previous call (its last samples)"
                )
            if cache_len > source.shape[-1]:
                raise ValueError(
                    f"HiFT cache_source has {cache_len} samples but this call makes only {source.shape[-1]} "
                    f"({mel.shape[-1]} mel frames x {self.config.upsample_scale}); the mel chunk is too short "
                    "for the cached source"
                )
            source = source.clone()
            source[:, :, :cache_len] = cache_source.to(source.dtype)
        return source
