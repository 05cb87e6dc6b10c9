# SPDX-License-Identifier: Apache-2.0
"""Hyperparameters of CosyVoice3's causal HiFT (`CausalHiFTGenerator`) and its streaming geometry.

Same widths, rates and kernels as the 24 kHz HiFT (`cosyvoice2.hift.HiFTConfig`); what is added
is how far the causal vocoder looks ahead, which fixes when a streamed frame becomes final:

| part                   | reads ahead             | reference                                        |
|------------------------|-------------------------|--------------------------------------------------|
| F0 predictor condnet.0 | 3 mel frames (kernel 4) | `CausalConvRNNF0Predictor`, causal_type 'right'  |
| conv_pre               | 4 mel frames (kernel 5) | `conv_pre_look_right: 4` in cosyvoice3.yaml      |
| iSTFT head             | 1 frame (overlap-add)   | non-final `inference` drops the last 480 samples |

So after N mel frames, the first N - 5 frames of audio are final (`MIN_EMIT_LAG_FRAMES`); the
reference's non-final `inference` cuts the F0 look-ahead off before conv_pre's and returns N - 8
(`REFERENCE_EMIT_LAG_FRAMES`, also minicpmo-utils 1.0.7's "delay 8").

The `hift:` section of a Fun-CosyVoice3 `cosyvoice3.yaml` (`!new:...CausalHiFTGenerator` with its
`CausalConvRNNF0Predictor`) is read as data by `hift_config_from_yaml` and checked against the
vocoder built from `hift.pt` (`check_hift_yaml`); `render_hift_section` writes it for stand-ins.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from vllm_omni_token2wav.model_executor.layers.hift.config import FULL_HIFT_CONFIG, HiFTConfig
from vllm_omni_token2wav.model_executor.model_loader.tagged_yaml import Tagged, read_tagged_yaml, resolve_refs


@dataclass(frozen=True)
class CausalHiFTConfig(HiFTConfig):
    """Shape of a causal HiFT generator; the defaults are Fun-CosyVoice3's (20,779,887 parameters)."""

    conv_pre_look_right: int = 4
    # The fixed noise table covers this many seconds; later samples wrap to its start.
    noise_table_seconds: int = 300

    @property
    def f0_lookahead(self) -> int:
        """Future mel frames one F0 frame reads (condnet.0 has kernel 4)."""
        return 3

    @property
    def noise_table_samples(self) -> int:
        return self.noise_table_seconds * self.sampling_rate

    @property
    def min_emit_lag_frames(self) -> int:
        """Mel frames a stream must hold back: conv_pre's look-ahead plus the iSTFT's overlap frame."""
        return self.conv_pre_look_right + 1

    @property
    def reference_emit_lag_frames(self) -> int:
        """What the reference's non-final `inference` holds back: F0 look-ahead + conv_pre + iSTFT (8)."""
        return self.f0_lookahead + self.conv_pre_look_right + 1


FULL_CAUSAL_HIFT_CONFIG = CausalHiFTConfig(**FULL_HIFT_CONFIG.__dict__)
# Same topology, narrow channels (as REDUCED_HIFT_CONFIG): every key of the real file with a smaller shape.
REDUCED_CAUSAL_HIFT_CONFIG = replace(FULL_CAUSAL_HIFT_CONFIG, base_channels=32, f0_channels=32)

# Facts about the shipped Fun-CosyVoice3 hift.pt (counted on the reference CausalHiFTGenerator).
FULL_CAUSAL_HIFT_NUM_KEYS = 328
FULL_CAUSAL_HIFT_NUM_PARAMS = 20_779_887

# What the reference's non-final inference returns after N frames: (N - 8) * 480 samples.
REFERENCE_EMIT_LAG_FRAMES = FULL_CAUSAL_HIFT_CONFIG.reference_emit_lag_frames
MIN_EMIT_LAG_FRAMES = FULL_CAUSAL_HIFT_CONFIG.min_emit_lag_frames


# ---- the `hift:` section of cosyvoice3.yaml ---------------------------------------------------------

TAG_CAUSAL_HIFT = "!new:cosyvoice.hifigan.generator.CausalHiFTGenerator"
TAG_CAUSAL_F0 = "!new:cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor"


def render_hift_section(config: CausalHiFTConfig) -> str:
    """The `hift:` entry of a cosyvoice3.yaml for `config` (the shipped file's layout; `!ref <sample_rate>`)."""
    c = config

    def nested(values: tuple[tuple[int, ...], ...]) -> str:
        return "[" + ", ".join("[" + ", ".join(str(v) for v in row) + "]" for row in values) + "]"

    def flat(values: tuple[int, ...]) -> str:
        return "[" + ", ".join(str(v) for v in values) + "]"

    return f"""hift: {TAG_CAUSAL_HIFT}
    in_channels: {c.in_channels}
    base_channels: {c.base_channels}
    nb_harmonics: {c.nb_harmonics}
    sampling_rate: !ref <sample_rate>
    nsf_alpha: {c.nsf_alpha:g}
    nsf_sigma: {c.nsf_sigma:g}
    nsf_voiced_threshold: {c.nsf_voiced_threshold:g}
    upsample_rates: {flat(c.upsample_rates)}
    upsample_kernel_sizes: {flat(c.upsample_kernel_sizes)}
    istft_params:
        n_fft: {c.istft_n_fft}
        hop_len: {c.istft_hop}
    resblock_kernel_sizes: {flat(c.resblock_kernel_sizes)}
    resblock_dilation_sizes: {nested(c.resblock_dilation_sizes)}
    source_resblock_kernel_sizes: {flat(c.source_resblock_kernel_sizes)}
    source_resblock_dilation_sizes: {nested(c.source_resblock_dilation_sizes)}
    lrelu_slope: {c.lrelu_slope:g}
    audio_limit: {c.audio_limit:g}
    conv_pre_look_right: {c.conv_pre_look_right}
    f0_predictor: {TAG_CAUSAL_F0}
        num_class: 1
        in_channels: {c.in_channels}
        cond_channels: {c.f0_channels}
"""


def hift_config_from_yaml(text_or_path: str | Path) -> CausalHiFTConfig | None:
    """The `hift:` section of a cosyvoice3.yaml as a `CausalHiFTConfig`; None when the file has none.

    Read as data (`model_loader.tagged_yaml`); a section tagged with another class, or missing a
    size, is an error naming the file and line.
    """
    source, doc = read_tagged_yaml(text_or_path, "cosyvoice3.yaml")
    if not isinstance(doc, dict) or "hift" not in doc:
        return None
    node = resolve_refs(doc["hift"], doc, source)
    if not isinstance(node, Tagged) or node.tag != TAG_CAUSAL_HIFT or not isinstance(node.value, dict):
        got = node.tag if isinstance(node, Tagged) else type(node).__name__
        raise ValueError(f"{source}: 'hift:' must be tagged {TAG_CAUSAL_HIFT} with a mapping, got {got}")
    args = node.value
    f0 = args.get("f0_predictor")
    if not isinstance(f0, Tagged) or f0.tag != TAG_CAUSAL_F0 or not isinstance(f0.value, dict):
        raise ValueError(f"{source}: hift.f0_predictor must be tagged {TAG_CAUSAL_F0} (line {node.line})")
    istft = args.get("istft_params", {})

    def need(mapping: dict[str, Any], key: str, where: str) -> Any:
        if key not in mapping:
            raise ValueError(f"{source}: {where} lacks {key!r} (line {node.line})")
        return mapping[key]

    def ints(value: Any) -> tuple[int, ...]:
        return tuple(int(v) for v in value)

    return CausalHiFTConfig(
        in_channels=int(need(args, "in_channels", "hift")),
        base_channels=int(need(args, "base_channels", "hift")),
        f0_channels=int(need(f0.value, "cond_channels", "hift.f0_predictor")),
        nb_harmonics=int(need(args, "nb_harmonics", "hift")),
        sampling_rate=int(need(args, "sampling_rate", "hift")),
        nsf_alpha=float(need(args, "nsf_alpha", "hift")),
        nsf_sigma=float(need(args, "nsf_sigma", "hift")),
        nsf_voiced_threshold=float(need(args, "nsf_voiced_threshold", "hift")),
        upsample_rates=ints(need(args, "upsample_rates", "hift")),
        upsample_kernel_sizes=ints(need(args, "upsample_kernel_sizes", "hift")),
        istft_n_fft=int(need(istft, "n_fft", "hift.istft_params")),
        istft_hop=int(need(istft, "hop_len", "hift.istft_params")),
        resblock_kernel_sizes=ints(need(args, "resblock_kernel_sizes", "hift")),
        resblock_dilation_sizes=tuple(ints(r) for r in need(args, "resblock_dilation_sizes", "hift")),
        source_resblock_kernel_sizes=ints(need(args, "source_resblock_kernel_sizes", "hift")),
        source_resblock_dilation_sizes=tuple(ints(r) for r in need(args, "source_resblock_dilation_sizes", "hift")),
        lrelu_slope=float(need(args, "lrelu_slope", "hift")),
        audio_limit=float(need(args, "audio_limit", "hift")),
        conv_pre_look_right=int(args.get("conv_pre_look_right", 4)),
    )


def check_hift_yaml(declared: CausalHiFTConfig, loaded: CausalHiFTConfig, source: str) -> None:
    """The yaml's `hift:` section describes the vocoder actually loaded (ValueError listing what differs)."""
    differ = [
        f"{f.name}: yaml {getattr(declared, f.name)!r}, hift.pt / in-tree {getattr(loaded, f.name)!r}"
        for f in fields(CausalHiFTConfig)
        if f.name not in ("noise_table_seconds", "f0_layers") and getattr(declared, f.name) != getattr(loaded, f.name)
    ]
    if differ:
        raise ValueError(
            f"{source}: the hift: section does not describe the causal HiFT in hift.pt (" + "; ".join(differ) + "); "
            "the in-tree vocoder implements CosyVoice3's 24 kHz configuration; is this the model's own cosyvoice3.yaml?"
        )
