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

Rows of different lengths in one launch (`vocode_rows`, the serving stage's vocoder step): each row's
F0, NSF source, STFT and iSTFT run on its own frames (they are per-sample or end-sensitive and
cheap), while the convolution stack, which is most of HiFT's arithmetic, runs once over the rows
right-padded to the longest. Every conv output is multiplied by a 0/1 mask of each row's length
at that stage, so a padded row reads zeros exactly where its unpadded call reads its zero padding
(leaky ReLU and Snake map 0 to 0): the rows' values are their solo values, up to the rounding of a
convolution launched with another batch size (~3e-8 on CPU, tested).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vllm_omni_token2wav.model_executor.layers.hift.config import FULL_HIFT_CONFIG, HiFTConfig
from vllm_omni_token2wav.model_executor.layers.hift.layers import HiFTBase, istft_head, stft_channels
from vllm_omni_token2wav.model_executor.layers.hift.source import DrawnNoise, NoiseSource, SourceModuleHnNSF


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

    def decode(self, mel: torch.Tensor, source: torch.Tensor, frames: Sequence[int] | None = None) -> torch.Tensor:
        """mel [B, 80, T], source [B, 1, 480 T] -> speech [B, 480 T].

        `frames` (host ints, max T): row i holds `frames[i]` mel frames and `480 frames[i]` source
        samples, right-padded; its speech is the first `480 frames[i]` samples, zeros after (see the
        module docstring). None: every row has all T frames.
        """
        n_fft, hop = self.config.istft_n_fft, self.config.istft_hop
        total = mel.shape[2]
        if frames is not None and all(n == total for n in frames):
            frames = None
        if frames is None:
            masks: list[torch.Tensor | None] = [None] * (len(self.ups) + 1)
            source_stft = stft_channels(source.squeeze(1), n_fft, hop, self.stft_window)
        else:
            masks = list(self._stage_masks(frames, total, mel.device, mel.dtype))
            mel = mel * masks[0]
            source_stft = self._rows_stft(source.squeeze(1), frames, total)
        x = _masked(self.conv_pre(mel), masks[0])
        for i, up in enumerate(self.ups):
            x = F.leaky_relu(x, self.config.lrelu_slope)
            x = up(x)
            if i == len(self.ups) - 1:
                x = self.reflection_pad(x)
            x = _masked(x, masks[i + 1])
            x = self.fuse(i, x, _masked(self.source_downs[i](source_stft), masks[i + 1]), mask=masks[i + 1])
        x = self.conv_post(F.leaky_relu(x))
        if frames is None:
            speech = istft_head(x, n_fft, hop, self.stft_window)
        else:
            speech = x.new_zeros(x.shape[0], total * self.config.upsample_scale)
            for n, rows in _rows_by_length(frames).items():
                stft_frames = self._stft_frames(n)
                part = istft_head(x[rows, :, :stft_frames], n_fft, hop, self.stft_window)
                speech[rows, : part.shape[1]] = part
        return torch.clamp(speech, -self.config.audio_limit, self.config.audio_limit)

    def _stft_frames(self, mel_frames: int) -> int:
        """STFT frames of the source of `mel_frames` mel frames (centred): 120 T + 1 at 24 kHz."""
        return mel_frames * self.config.upsample_scale // self.config.istft_hop + 1

    def _rows_stft(self, source: torch.Tensor, frames: Sequence[int], total: int) -> torch.Tensor:
        """`stft_channels` of each row's own samples (its reflect padding at its own end), zeros after."""
        n_fft, hop, scale = self.config.istft_n_fft, self.config.istft_hop, self.config.upsample_scale
        out = source.new_zeros(source.shape[0], self.config.stft_channels, self._stft_frames(total))
        for n, rows in _rows_by_length(frames).items():
            spec = stft_channels(source[rows, : n * scale], n_fft, hop, self.stft_window)
            out[rows, :, : spec.shape[2]] = spec
        return out

    def _stage_masks(
        self, frames: Sequence[int], total: int, device: torch.device, dtype: torch.dtype
    ) -> list[torch.Tensor]:
        """0/1 masks [B, 1, L] of each row's length at the mel rate and after every up-sampling stage.

        Lengths follow the layers' arithmetic: ConvTranspose (L - 1) u - 2 p + k, plus the last
        stage's one-frame reflection pad (the unpadded call's lengths, so `fuse` sees equal sizes).
        """
        lengths = [list(frames)]
        sizes = [total]
        for i, up in enumerate(self.ups):
            u, p, k = up.stride[0], up.padding[0], up.kernel_size[0]
            extra = 1 if i == len(self.ups) - 1 else 0
            lengths.append([(n - 1) * u - 2 * p + k + extra for n in lengths[-1]])
            sizes.append((sizes[-1] - 1) * u - 2 * p + k + extra)
        ends = torch.tensor(lengths, dtype=torch.long).to(device, non_blocking=True)  # [stages + 1, B]
        return [
            (torch.arange(size, device=device)[None, None, :] < ends[s][:, None, None]).to(dtype)
            for s, size in enumerate(sizes)
        ]

    def source(self, mel: torch.Tensor, generator: NoiseSource = None) -> torch.Tensor:
        """mel [B, 80, T] -> NSF excitation [B, 1, 480 T].

        With per-row generators (a batch of independent requests) F0 is predicted row by row: a
        batched convolution rounds differently from a batch-1 one (~1e-7 relative), and the sine
        source integrates the phase over the whole chunk (cumsum x 2 pi x 9 harmonics), which turns
        that into ~1e-4 differences in the excitation. Row by row, each row's source is its solo one.
        """
        if generator is not None and not isinstance(generator, torch.Generator) and mel.shape[0] > 1:
            # The whole source row by row: bit-equal to each row's batch-1 call, and a row's
            # sample-rate tensors (480 T x 9 harmonics) stay in cache instead of B rows' worth.
            return torch.cat([self.source(mel[i : i + 1], noise) for i, noise in enumerate(_row_noise(generator, mel))])
        f0_frames = self.f0_predictor(mel)[..., None]  # [B, T, 1]
        f0 = torch.repeat_interleave(f0_frames, self.config.upsample_scale, dim=1)  # nearest x480
        return self.m_source(f0, generator, f0_frames=f0_frames).transpose(1, 2)

    def vocode_rows(
        self,
        mels: Sequence[torch.Tensor],
        cache_sources: Sequence[torch.Tensor | None],
        generators: Sequence[torch.Generator | None],
        *,
        pad_rows: int = 0,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Vocode rows of any lengths in one launch (see the module docstring).

        `mels[i]` [1, 80, T_i], `cache_sources[i]` [1, 1, S_i] or None (as `forward`), `generators[i]`
        the row's own noise generator (None: zero noise). `pad_rows` zero rows are appended (a
        bucketed batch size); they have zero source and are dropped. Returns (speech [rows, 480 max T]
        with zeros after each row's `480 T_i` samples, the rows' sources `[1, 1, 480 T_i]`); row i
        equals `forward(mels[i], cache_sources[i], generator=generators[i])`.
        """
        if not (len(mels) == len(cache_sources) == len(generators)) or not mels:
            raise ValueError(
                f"HiFT vocode_rows: {len(mels)} mels, {len(cache_sources)} cached sources and {len(generators)} "
                "generators; one of each per row, at least one row"
            )
        sources = []
        for mel, cache, gen in zip(mels, cache_sources, generators, strict=True):
            self.check_mel(mel)
            if mel.shape[0] != 1:
                raise ValueError(f"HiFT vocode_rows: each row's mel must be [1, 80, T], got {tuple(mel.shape)}")
            mel = mel.to(self.conv_pre.weight.dtype)
            # Per row, as a batch-1 call: F0 rounding feeds the phase integral (see `source`).
            sources.append(self._with_cached_source(self.source(mel, [gen]), cache, mel))
        frames = [int(m.shape[2]) for m in mels] + [max(int(m.shape[2]) for m in mels)] * pad_rows
        total = max(frames)
        dtype = self.conv_pre.weight.dtype
        mel = torch.zeros(len(frames), mels[0].shape[1], total, device=mels[0].device, dtype=dtype)
        source = mel.new_zeros(len(frames), 1, total * self.config.upsample_scale)
        for i, (m, src) in enumerate(zip(mels, sources, strict=True)):
            mel[i, :, : m.shape[2]] = m[0]
            source[i, :, : src.shape[2]] = src[0]
        speech = self.decode(mel, source, frames)
        return speech[: len(mels)], sources

    def _with_cached_source(
        self, source: torch.Tensor, cache_source: torch.Tensor | None, mel: torch.Tensor
    ) -> torch.Tensor:
        """`source` with its first samples overwritten by `cache_source` (see `forward`)."""
        if cache_source is None or cache_source.shape[-1] == 0:
            return source
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
        return self._with_cached_source(self.source(mel, generator), cache_source, mel)


def _row_noise(generator: Sequence[torch.Generator | None] | DrawnNoise, mel: torch.Tensor) -> list[NoiseSource]:
    """Each row's own noise source of a per-row `generator` (generators, or noise drawn ahead)."""
    rows = mel.shape[0]
    if isinstance(generator, DrawnNoise):
        if generator.initial_phase.shape[0] != rows:
            raise ValueError(f"NSF noise drawn ahead for {generator.initial_phase.shape[0]} rows, a batch of {rows}")
        return [DrawnNoise(generator.initial_phase[i : i + 1], generator.harmonics[i : i + 1]) for i in range(rows)]
    if len(generator) != rows:
        raise ValueError(f"NSF noise: {len(generator)} per-row generators for a batch of {rows} rows")
    return [[gen] for gen in generator]


def _masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return x if mask is None else x.mul_(mask)


def _rows_by_length(frames: Sequence[int]) -> dict[int, list[int]]:
    """Row indices grouped by their frame count (one STFT / iSTFT call per distinct length)."""
    groups: dict[int, list[int]] = {}
    for row, n in enumerate(frames):
        groups.setdefault(n, []).append(row)
    return groups
