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

from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vllm_omni.model_executor.models.cosyvoice2.hift.config import FULL_HIFT_CONFIG, HiFTConfig
from vllm_omni.model_executor.models.cosyvoice2.hift.source import NoiseSource, SourceModuleHnNSF


def _same_padding(kernel_size: int, dilation: int) -> int:
    return (kernel_size * dilation - dilation) // 2


class Snake(nn.Module):
    """Snake activation x + sin^2(alpha x) / (alpha + 1e-9), per-channel alpha (linear scale). Key: `alpha`."""

    def __init__(self, channels: int, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha[None, :, None]
        return x + (1.0 / (alpha + 1e-9)) * torch.sin(x * alpha).pow(2)


class ResBlock(nn.Module):
    """Dilated residual block: for each dilation d, x += conv2(snake(conv1_d(snake(x))))."""

    def __init__(
        self, channels: int, kernel_size: int, dilations: tuple[int, ...], *, dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(
                channels, channels, kernel_size, 1, dilation=d, padding=_same_padding(kernel_size, d), dtype=dtype
            )
            for d in dilations
        )
        self.convs2 = nn.ModuleList(
            nn.Conv1d(
                channels, channels, kernel_size, 1, dilation=1, padding=_same_padding(kernel_size, 1), dtype=dtype
            )
            for _ in dilations
        )
        self.activations1 = nn.ModuleList(Snake(channels, dtype=dtype) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels, dtype=dtype) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv1, conv2, act1, act2 in zip(
            self.convs1, self.convs2, self.activations1, self.activations2, strict=True
        ):
            x = x + conv2(act2(conv1(act1(x))))
        return x


class ConvRNNF0Predictor(nn.Module):
    """F0 from mel: 5 x [Conv1d k3 -> ELU] (`condnet.{0,2,4,6,8}`) -> Linear(C, 1) (`classifier`) -> abs."""

    def __init__(
        self, in_channels: int, cond_channels: int, num_layers: int, *, dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(num_layers):
            layers.append(nn.Conv1d(in_channels if i == 0 else cond_channels, cond_channels, 3, padding=1, dtype=dtype))
            layers.append(nn.ELU())
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, 1, dtype=dtype)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel [B, 80, T] -> f0 [B, T] (Hz, non-negative)."""
        hidden = self.condnet(mel).transpose(1, 2)
        return torch.abs(self.classifier(hidden).squeeze(-1))


class HiFTGenerator(nn.Module):
    """The 24 kHz HiFT vocoder; `forward(mel, cache_source=None, generator=None) -> (speech, source)`."""

    stft_window: torch.Tensor

    def __init__(self, config: HiFTConfig = FULL_HIFT_CONFIG, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = config
        cfg = config
        n_fft = cfg.istft_n_fft
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
        # The source branch meets stage i at that stage's rate: cumulative strides 15, 3, 1 of the
        # source STFT frames (120 T + 1) down to 8 T, 40 T, 120 T + 1.
        down_rates = [1, *cfg.upsample_rates[::-1][:-1]]
        cum_rates = np.cumprod(down_rates)[::-1].tolist()
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        for i, (rate, k, d) in enumerate(
            zip(cum_rates, cfg.source_resblock_kernel_sizes, cfg.source_resblock_dilation_sizes, strict=True)
        ):
            ch = cfg.stage_channels(i)
            if rate == 1:
                self.source_downs.append(nn.Conv1d(cfg.stft_channels, ch, 1, 1, dtype=dtype))
            else:
                self.source_downs.append(
                    nn.Conv1d(cfg.stft_channels, ch, int(rate) * 2, int(rate), padding=int(rate) // 2, dtype=dtype)
                )
            self.source_resblocks.append(ResBlock(ch, k, tuple(d), dtype=dtype))
        self.resblocks = nn.ModuleList(
            ResBlock(cfg.stage_channels(i), k, tuple(d), dtype=dtype)
            for i in range(len(self.ups))
            for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes, strict=True)
        )
        self.conv_post = nn.Conv1d(
            cfg.stage_channels(len(self.ups) - 1), cfg.stft_channels, 7, 1, padding=3, dtype=dtype
        )
        self.reflection_pad = nn.ReflectionPad1d((1, 0))
        self.f0_predictor = ConvRNNF0Predictor(cfg.in_channels, cfg.f0_channels, cfg.f0_layers, dtype=dtype)
        # Periodic Hann computed in float64 then rounded, like scipy's get_window("hann", 16).
        # Non-persistent: the shipped state_dict has no window, and strict loading must stay strict.
        window = torch.hann_window(n_fft, periodic=True, dtype=torch.float64, device="cpu").to(torch.float32)
        self.register_buffer("stft_window", window, persistent=False)

    @property
    def num_kernels(self) -> int:
        return len(self.config.resblock_kernel_sizes)

    def weight_norm_modules(self) -> list[tuple[str, nn.Module]]:
        """The 82 (full size) modules whose `weight` is stored as weight norm (dim 0) in hift.pt."""
        names: list[tuple[str, nn.Module]] = [("conv_pre", self.conv_pre), ("conv_post", self.conv_post)]
        names += [(f"ups.{i}", m) for i, m in enumerate(self.ups)]
        for prefix, blocks in (("resblocks", self.resblocks), ("source_resblocks", self.source_resblocks)):
            for i, block in enumerate(cast(list[ResBlock], list(blocks))):
                for j, conv in enumerate(block.convs1):
                    names.append((f"{prefix}.{i}.convs1.{j}", conv))
                for j, conv in enumerate(block.convs2):
                    names.append((f"{prefix}.{i}.convs2.{j}", conv))
        for i, layer in enumerate(self.f0_predictor.condnet):
            if isinstance(layer, nn.Conv1d):
                names.append((f"f0_predictor.condnet.{i}", layer))
        return names

    def _stft(self, x: torch.Tensor) -> torch.Tensor:
        n_fft, hop = self.config.istft_n_fft, self.config.istft_hop
        spec = torch.stft(
            x,
            n_fft,
            hop,
            n_fft,
            window=self.stft_window.to(x.dtype),
            center=True,
            pad_mode="reflect",
            return_complex=True,
        )
        spec = torch.view_as_real(spec)
        return torch.cat([spec[..., 0], spec[..., 1]], dim=1)

    def _istft(self, magnitude: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
        n_fft, hop = self.config.istft_n_fft, self.config.istft_hop
        magnitude = torch.clip(magnitude, max=1e2)
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        return torch.istft(spec, n_fft, hop, n_fft, window=self.stft_window.to(magnitude.dtype))

    def decode(self, mel: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """mel [B, 80, T], source [B, 1, 480 T] -> speech [B, 480 T]."""
        source_stft = self._stft(source.squeeze(1))
        x = self.conv_pre(mel)
        for i, up in enumerate(self.ups):
            x = F.leaky_relu(x, self.config.lrelu_slope)
            x = up(x)
            if i == len(self.ups) - 1:
                x = self.reflection_pad(x)
            x = x + self.source_resblocks[i](self.source_downs[i](source_stft))
            acc = self.resblocks[i * self.num_kernels](x)
            for j in range(1, self.num_kernels):
                acc = acc + self.resblocks[i * self.num_kernels + j](x)
            x = acc / self.num_kernels
        x = self.conv_post(F.leaky_relu(x))
        bins = self.config.istft_n_fft // 2 + 1
        magnitude = torch.exp(x[:, :bins, :])
        phase = torch.sin(x[:, bins:, :])
        speech = self._istft(magnitude, phase)
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
        `None` for padding rows) gives every row the noise of its own batch-1 call (`source.draw`).
        """
        self._check_mel(mel)
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
        return self.decode(mel, source), source

    def _check_mel(self, mel: torch.Tensor) -> None:
        if mel.dim() != 3 or mel.shape[1] != self.config.in_channels:
            raise ValueError(
                f"HiFT expects mel [B, {self.config.in_channels}, T], got {tuple(mel.shape)}; "
                "is the flow output transposed ([B, T, 80])?"
            )
        if mel.shape[-1] < 1:
            raise ValueError("HiFT got a mel with 0 frames; nothing to vocode")
        if not mel.is_floating_point():
            raise ValueError(f"HiFT expects a floating-point mel, got {mel.dtype}")
