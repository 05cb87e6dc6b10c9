# SPDX-License-Identifier: Apache-2.0
"""An independent, functional re-statement of the reference `CausalHiFTGenerator.inference` for the tests.

Written from the reference's description (CosyVoice `hifigan/generator.py`, `f0_predictor.py`,
`transformer/convolution.py` at ace7c47), not from the in-tree modules: every causal conv is
"pad with zeros, then F.conv1d", the up-sampling is `F.interpolate(nearest)`, the phase goes
through the linear 1/480 down-interpolation and the nearest x480 up-interpolation in the
reference's tensor layouts, the STFT is the centred `torch.stft`, and the noise is a literal
`torch.rand` draw in the reference's order. Only the parameters are read from the model under
test (`model.state_dict()`, weight norm already folded).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from vllm_omni_token2wav.model_executor.layers.hift_causal import CausalHiFTGenerator


def reference_noise(seed: int, draws_before: int, samples: int, harmonics: int = 9) -> torch.Tensor:
    """[1, samples, H]: the first rows of `sine_waves` for a generator seeded then advanced `draws_before`."""
    g = torch.Generator().manual_seed(seed)
    if draws_before:
        torch.rand(draws_before, generator=g)
    torch.rand(1, harmonics, generator=g)  # rand_ini
    return torch.rand(1, samples, harmonics, generator=g)


def _conv(x: torch.Tensor, sd: dict[str, torch.Tensor], name: str, **kw: int) -> torch.Tensor:
    return F.conv1d(x, sd[f"{name}.weight"].to(x.dtype), sd[f"{name}.bias"].to(x.dtype), **kw)


def _left(x: torch.Tensor, pad: int) -> torch.Tensor:
    return F.pad(x, (pad, 0)) if pad else x


def _snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    a = alpha[None, :, None]
    return x + (1.0 / (a + 1e-9)) * torch.pow(torch.sin(x * a), 2)


def _resblock(
    x: torch.Tensor, sd: dict[str, torch.Tensor], name: str, k: int, dilations: tuple[int, ...]
) -> torch.Tensor:
    for j, d in enumerate(dilations):
        xt = _snake(x, sd[f"{name}.activations1.{j}.alpha"])
        xt = _conv(_left(xt, (k - 1) * d), sd, f"{name}.convs1.{j}", dilation=d)
        xt = _snake(xt, sd[f"{name}.activations2.{j}.alpha"])
        xt = _conv(_left(xt, k - 1), sd, f"{name}.convs2.{j}")
        x = xt + x
    return x


def reference_f0(model: CausalHiFTGenerator, mel: torch.Tensor, finalize: bool) -> torch.Tensor:
    """F0 [B, T] (finalize) or [B, T - 3]: float64 convs, rounded to float32 like `.to(speech_feat)`."""
    sd = {k: v.double() for k, v in model.f0_predictor.state_dict().items()}
    x = mel.double()
    x = _conv(F.pad(x, (0, 3)) if finalize else x, sd, "condnet.0")
    x = F.elu(x)
    for i in (2, 4, 6, 8):
        x = F.elu(_conv(_left(x, 2), sd, f"condnet.{i}"))
    x = F.linear(x.transpose(1, 2), sd["classifier.weight"], sd["classifier.bias"])
    return torch.abs(x.squeeze(-1)).to(mel.dtype)


def reference_source(model: CausalHiFTGenerator, f0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """SineGen2(causal=True) + SourceModuleHnNSF: f0 [B, T] -> source [B, 1, 480 T]."""
    cfg = model.config
    scale = cfg.upsample_scale
    s = F.interpolate(f0[:, None], scale_factor=float(scale), mode="nearest").transpose(1, 2)  # [B, L, 1]
    fn = s * torch.arange(1, cfg.nb_harmonics + 2, dtype=s.dtype)[None, None, :]
    rad = (fn / cfg.sampling_rate) % 1
    # rand_ini: added to sample 0 only, which the midpoint down-interpolation never reads.
    rad[:, 0, :] = rad[:, 0, :] + torch.rand(1, cfg.nb_harmonics + 1, generator=torch.Generator().manual_seed(0))
    rad = F.interpolate(rad.transpose(1, 2), scale_factor=1 / scale, mode="linear").transpose(1, 2)
    phase = torch.cumsum(rad, dim=1) * 2 * math.pi
    phase = F.interpolate(phase.transpose(1, 2) * scale, scale_factor=float(scale), mode="nearest").transpose(1, 2)
    sines = torch.sin(phase) * cfg.nsf_alpha
    uv = (s > cfg.nsf_voiced_threshold).float()
    noise_amp = uv * cfg.nsf_sigma + (1 - uv) * cfg.nsf_alpha / 3
    excitation = sines * uv + noise_amp * noise[:, : s.shape[1]]
    sd = model.m_source.state_dict()
    merged = torch.tanh(F.linear(excitation, sd["l_linear.weight"], sd["l_linear.bias"]))
    return merged.transpose(1, 2)


def reference_decode(
    model: CausalHiFTGenerator, mel: torch.Tensor, source: torch.Tensor, finalize: bool
) -> torch.Tensor:
    """CausalHiFTGenerator.decode: mel [B, 80, T'] + source [B, 1, 480 T'] -> speech."""
    cfg = model.config
    sd = model.state_dict()
    n_fft, hop, look = cfg.istft_n_fft, cfg.istft_hop, cfg.conv_pre_look_right
    window = model.stft_window
    spec = torch.view_as_real(torch.stft(source.squeeze(1), n_fft, hop, n_fft, window=window, return_complex=True))
    s_stft = torch.cat([spec[..., 0], spec[..., 1]], dim=1)
    if finalize:
        x = _conv(F.pad(mel, (0, look)), sd, "conv_pre")
    else:
        x = _conv(mel, sd, "conv_pre")  # the last `look` frames are the look-ahead
        s_stft = s_stft[:, :, : -math.prod(cfg.upsample_rates) * look]
    rates = model.source_down_rates(cfg)
    for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes, strict=True)):
        x = F.leaky_relu(x, cfg.lrelu_slope)
        x = F.interpolate(x, scale_factor=float(u), mode="nearest")
        x = _conv(_left(x, k - 1), sd, f"ups.{i}")
        if i == len(cfg.upsample_rates) - 1:
            x = F.pad(x, (1, 0), mode="reflect")
        r = rates[i]
        si = _conv(_left(s_stft, r - 1 if r > 1 else 0), sd, f"source_downs.{i}", stride=r)
        k_s, d_s = cfg.source_resblock_kernel_sizes[i], cfg.source_resblock_dilation_sizes[i]
        x = x + _resblock(si, sd, f"source_resblocks.{i}", k_s, tuple(d_s))
        acc = None
        for j, (k_r, d_r) in enumerate(zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes, strict=True)):
            out = _resblock(x, sd, f"resblocks.{i * 3 + j}", k_r, tuple(d_r))
            acc = out if acc is None else acc + out
        assert acc is not None
        x = acc / 3
    x = _conv(_left(F.leaky_relu(x), 6), sd, "conv_post")
    bins = n_fft // 2 + 1
    magnitude = torch.clip(torch.exp(x[:, :bins]), max=1e2)
    phase = torch.sin(x[:, bins:])
    spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
    speech = torch.istft(spec, n_fft, hop, n_fft, window=window)
    if not finalize:
        speech = speech[:, : -cfg.upsample_scale]
    return torch.clamp(speech, -cfg.audio_limit, cfg.audio_limit)


def reference_inference(
    model: CausalHiFTGenerator, mel: torch.Tensor, noise: torch.Tensor, finalize: bool = True
) -> torch.Tensor:
    """The reference's `inference(speech_feat, finalize)`: speech [B, 480 T] or [B, 480 (T - 8)]."""
    with torch.inference_mode():
        f0 = reference_f0(model, mel, finalize)
        source = reference_source(model, f0, noise)
        features = mel if finalize else mel[:, :, : -model.config.f0_lookahead]
        return reference_decode(model, features, source, finalize)
