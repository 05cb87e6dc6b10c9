# SPDX-License-Identifier: Apache-2.0
"""Read (and write) a CosyVoice-layout vocoder yaml as data: the causal HiFT's hyperparameters and noise seed.

MiniCPM-o's causal-vocoder assets (minicpmo-utils 1.0.7) describe the vocoder in a hyperpyyaml
`config.yaml` that the reference loads with `load_hyperpyyaml(..., overrides={'hifigan': None})`
and then reads `config['hift']` (a `CausalHiFTGenerator`) and `config['feat_extractor'].keywords`
(the mel settings it requires). This reader takes the same facts from the file without importing
or calling anything named in it (`model_loader.tagged_yaml`):

| entry               | tag                                                            | read into          |
|---------------------|----------------------------------------------------------------|--------------------|
| `hift`              | `!new:cosyvoice.hifigan.generator.CausalHiFTGenerator`         | `CausalHiFTConfig` |
| `hift.f0_predictor` | `!new:cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor` | `f0_channels`      |
| `feat_extractor`    | a `!name:` function (reference: `matcha.utils.audio.mel_spectrogram`) | keywords    |
| `__set_seed*`       | `!apply:torch.manual_seed [N]` before `hift`                   | the noise's seed   |

Arguments missing from `hift` take the reference constructor's defaults (`REFERENCE_DEFAULTS`;
note 22050 Hz and two up-sampling stages there), unknown ones are errors, as they would be for
the reference constructor.

Why the seed: the causal HiFT draws its fixed noise table from torch's global generator while it
is constructed (`noise.py`), so the table is whatever the yaml seeded, advanced by the draws of
everything built in between: here the F0 predictor's default init (`NoiseOrigin.vocoder_yaml`).
Another object built between the seed and the vocoder (a top-level `!new:` / `!apply:` other than
the seed lines and the `hifigan` entry the reference overrides with None) would shift the table by
an unknown number of draws: `noise_origin()` refuses such a file instead of guessing. A file that
seeds nothing makes the reference's table depend on the process's history; the CosyVoice seed
(1986) is then used, with a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.layers.hift_causal.config import FULL_CAUSAL_HIFT_CONFIG, CausalHiFTConfig
from vllm_omni_token2wav.model_executor.layers.hift_causal.noise import NoiseOrigin
from vllm_omni_token2wav.model_executor.model_loader.tagged_yaml import Tagged, read_tagged_yaml, resolve_refs

logger = init_logger(__name__)

TAG_CAUSAL_HIFT = "!new:cosyvoice.hifigan.generator.CausalHiFTGenerator"
TAG_CAUSAL_F0 = "!new:cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor"
TAG_MEL = "!name:matcha.utils.audio.mel_spectrogram"
TAG_TORCH_SEED = "!apply:torch.manual_seed"
#: Seed lines of CosyVoice configs that do not touch torch's CPU generator.
_OTHER_SEED_TAGS = ("!apply:random.seed", "!apply:numpy.random.seed", "!apply:torch.cuda.manual_seed_all")
#: Entries the reference loader overrides with None (never built).
OVERRIDDEN_ENTRIES = ("hifigan",)
#: CosyVoice's training configs seed everything with this (`__set_seed*` lines).
COSYVOICE_SEED = 1986

#: `CausalHiFTGenerator.__init__` defaults of the reference (CosyVoice ace7c47, minicpmo-utils 1.0.7).
REFERENCE_DEFAULTS: dict[str, Any] = {
    "in_channels": 80,
    "base_channels": 512,
    "nb_harmonics": 8,
    "sampling_rate": 22050,
    "nsf_alpha": 0.1,
    "nsf_sigma": 0.003,
    "nsf_voiced_threshold": 10,
    "upsample_rates": [8, 8],
    "upsample_kernel_sizes": [16, 16],
    "istft_params": {"n_fft": 16, "hop_len": 4},
    "resblock_kernel_sizes": [3, 7, 11],
    "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "source_resblock_kernel_sizes": [7, 11],
    "source_resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5]],
    "lrelu_slope": 0.1,
    "audio_limit": 0.99,
    "conv_pre_look_right": 4,
}
#: `CausalConvRNNF0Predictor.__init__` defaults of the reference.
F0_DEFAULTS: dict[str, Any] = {"num_class": 1, "in_channels": 80, "cond_channels": 512}


@dataclass(frozen=True)
class VocoderYaml:
    """What a vocoder yaml says: the causal HiFT's shape, the torch seed before it, the mel settings."""

    source: str
    config: CausalHiFTConfig
    #: `torch.manual_seed` applied before `hift` is built (the last one), None if the file seeds nothing.
    seed: int | None
    #: Top-level entries built between that seed and `hift` (their draws would shift the noise table).
    built_between: tuple[str, ...] = ()
    #: Keyword arguments of `feat_extractor` (None when the file has none).
    feat_extractor: Mapping[str, Any] | None = field(default=None)

    def noise_origin(self) -> NoiseOrigin:
        """Where the reference's global generator stands when this file's vocoder draws its noise table."""
        if self.built_between:
            raise ValueError(
                f"{self.source}: {', '.join(self.built_between)} are built after torch.manual_seed and before "
                "`hift`; their random draws move the causal vocoder's noise table by an amount this reader cannot "
                "know. Move them after `hift` (or pass the noise table explicitly to load_causal_hift)"
            )
        if self.seed is None:
            logger.warning(
                "%s seeds nothing before building `hift`: the reference would draw the causal vocoder's noise table "
                "from whatever state torch's global generator is in; using CosyVoice's seed %d",
                self.source,
                COSYVOICE_SEED,
            )
            return NoiseOrigin.vocoder_yaml(self.config, COSYVOICE_SEED)
        return NoiseOrigin.vocoder_yaml(self.config, self.seed)


def _arguments(node: Any, tag: str, source: str, where: str, allowed: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(node, Tagged) or node.tag != tag:
        got = node.tag if isinstance(node, Tagged) else type(node).__name__
        raise ValueError(f"{source}: `{where}` must be tagged {tag}, got {got}")
    args = node.value if node.value is not None else {}
    if not isinstance(args, dict):
        raise ValueError(f"{source}: line {node.line}: {tag} must carry a mapping of arguments")
    unknown = sorted(set(args) - set(allowed) - {"f0_predictor"})
    if unknown:
        raise ValueError(f"{source}: line {node.line}: `{where}` has unknown arguments {unknown} for {tag}")
    return {**allowed, **args}


def _ints(value: Any, name: str, source: str) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{source}: hift.{name} must be a list of integers, got {value!r}")
    return tuple(value)


def _config(hift: Any, source: str) -> CausalHiFTConfig:
    args = _arguments(hift, TAG_CAUSAL_HIFT, source, "hift", REFERENCE_DEFAULTS)
    if "f0_predictor" not in args or args["f0_predictor"] is None:
        raise ValueError(f"{source}: `hift` has no f0_predictor (the reference needs a {TAG_CAUSAL_F0})")
    f0 = _arguments(args["f0_predictor"], TAG_CAUSAL_F0, source, "hift.f0_predictor", F0_DEFAULTS)
    if f0["num_class"] != 1 or f0["in_channels"] != args["in_channels"]:
        raise ValueError(
            f"{source}: hift.f0_predictor has num_class {f0['num_class']} and in_channels {f0['in_channels']}; "
            f"the vocoder needs 1 and its own in_channels {args['in_channels']}"
        )
    istft = args["istft_params"]
    if not isinstance(istft, dict) or set(istft) != {"n_fft", "hop_len"}:
        raise ValueError(f"{source}: hift.istft_params must be {{n_fft, hop_len}}, got {istft!r}")
    return CausalHiFTConfig(
        in_channels=int(args["in_channels"]),
        base_channels=int(args["base_channels"]),
        f0_channels=int(f0["cond_channels"]),
        nb_harmonics=int(args["nb_harmonics"]),
        sampling_rate=int(args["sampling_rate"]),
        nsf_alpha=float(args["nsf_alpha"]),
        nsf_sigma=float(args["nsf_sigma"]),
        nsf_voiced_threshold=float(args["nsf_voiced_threshold"]),
        upsample_rates=_ints(args["upsample_rates"], "upsample_rates", source),
        upsample_kernel_sizes=_ints(args["upsample_kernel_sizes"], "upsample_kernel_sizes", source),
        istft_n_fft=int(istft["n_fft"]),
        istft_hop=int(istft["hop_len"]),
        resblock_kernel_sizes=_ints(args["resblock_kernel_sizes"], "resblock_kernel_sizes", source),
        resblock_dilation_sizes=tuple(
            _ints(d, "resblock_dilation_sizes", source) for d in args["resblock_dilation_sizes"]
        ),
        source_resblock_kernel_sizes=_ints(
            args["source_resblock_kernel_sizes"], "source_resblock_kernel_sizes", source
        ),
        source_resblock_dilation_sizes=tuple(
            _ints(d, "source_resblock_dilation_sizes", source) for d in args["source_resblock_dilation_sizes"]
        ),
        lrelu_slope=float(args["lrelu_slope"]),
        audio_limit=float(args["audio_limit"]),
        conv_pre_look_right=int(args["conv_pre_look_right"]),
        f0_layers=FULL_CAUSAL_HIFT_CONFIG.f0_layers,
        noise_table_seconds=FULL_CAUSAL_HIFT_CONFIG.noise_table_seconds,
    )


def _builds(node: Any) -> bool:
    """Whether constructing `node` calls anything (a `!new:` or `!apply:` anywhere inside it)."""
    if isinstance(node, Tagged):
        return node.tag.startswith(("!new:", "!apply:")) or _builds(node.value)
    if isinstance(node, dict):
        return any(_builds(v) for v in node.values())
    if isinstance(node, list):
        return any(_builds(v) for v in node)
    return False


def _seed_value(node: Tagged, source: str) -> int:
    value = node.value[0] if isinstance(node.value, list) and len(node.value) == 1 else node.value
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{source}: line {node.line}: {TAG_TORCH_SEED} needs one integer, got {node.value!r}")
    return value


def read_vocoder_yaml(text_or_path: str | Path, what: str = "config.yaml") -> VocoderYaml:
    """Parse a vocoder yaml path (or its text); see the module docstring for what is read."""
    source, doc = read_tagged_yaml(text_or_path, what)
    if not isinstance(doc, dict) or "hift" not in doc:
        keys = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"{source}: expected a top-level `hift:` entry (the causal vocoder), got {keys}")
    seed: int | None = None
    built: list[str] = []
    for key, node in doc.items():
        if key == "hift":
            break
        if isinstance(node, Tagged) and node.tag == TAG_TORCH_SEED:
            seed, built = _seed_value(node, source), []
        elif isinstance(node, Tagged) and node.tag in _OTHER_SEED_TAGS:
            continue
        elif key not in OVERRIDDEN_ENTRIES and _builds(node):
            built.append(f"`{key}`")
    config = _config(resolve_refs(doc["hift"], doc, source), source)
    feat = doc.get("feat_extractor")
    keywords = None
    if feat is not None:
        feat = resolve_refs(feat, doc, source)
        if not isinstance(feat, Tagged) or not feat.tag.startswith("!name:") or not isinstance(feat.value, dict):
            raise ValueError(f"{source}: `feat_extractor` must be a !name: function with keyword arguments")
        keywords = dict(feat.value)
    return VocoderYaml(
        source=source,
        config=config,
        seed=seed,
        built_between=tuple(built) if seed is not None else (),
        feat_extractor=keywords,
    )


def _scalar(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def render_vocoder_yaml(
    config: CausalHiFTConfig,
    *,
    seed: int = COSYVOICE_SEED,
    feat_extractor: Mapping[str, Any] | None = None,
    header: str = "causal HiFT vocoder",
) -> str:
    """hyperpyyaml text that builds `config` after CosyVoice's seed lines (what stand-in directories ship).

    The reference loader (hyperpyyaml) builds from it the same vocoder and noise table as
    `read_vocoder_yaml` describes; `feat_extractor` adds a `!name:` mel-spectrogram entry.
    """
    hift = {
        "in_channels": config.in_channels,
        "base_channels": config.base_channels,
        "nb_harmonics": config.nb_harmonics,
        "sampling_rate": "!ref <sample_rate>",
        "nsf_alpha": config.nsf_alpha,
        "nsf_sigma": config.nsf_sigma,
        "nsf_voiced_threshold": config.nsf_voiced_threshold,
        "upsample_rates": list(config.upsample_rates),
        "upsample_kernel_sizes": list(config.upsample_kernel_sizes),
        "resblock_kernel_sizes": list(config.resblock_kernel_sizes),
        "resblock_dilation_sizes": [list(d) for d in config.resblock_dilation_sizes],
        "source_resblock_kernel_sizes": list(config.source_resblock_kernel_sizes),
        "source_resblock_dilation_sizes": [list(d) for d in config.source_resblock_dilation_sizes],
        "lrelu_slope": config.lrelu_slope,
        "audio_limit": config.audio_limit,
        "conv_pre_look_right": config.conv_pre_look_right,
    }
    lines = [
        f"# {header} (in-tree reader: vllm_omni_token2wav.model_executor.layers.hift_causal.yaml_config)",
        f"__set_seed1: !apply:random.seed [{seed}]",
        f"__set_seed2: !apply:numpy.random.seed [{seed}]",
        f"__set_seed3: {TAG_TORCH_SEED} [{seed}]",
        f"__set_seed4: !apply:torch.cuda.manual_seed_all [{seed}]",
        f"sample_rate: {config.sampling_rate}",
        f"hift: {TAG_CAUSAL_HIFT}",
    ]
    for key, value in hift.items():
        lines.append(f"    {key}: {value if isinstance(value, str) else _scalar(value)}")
    lines += ["    istft_params:", f"        n_fft: {config.istft_n_fft}", f"        hop_len: {config.istft_hop}"]
    lines += [
        f"    f0_predictor: {TAG_CAUSAL_F0}",
        "        num_class: 1",
        f"        in_channels: {config.in_channels}",
        f"        cond_channels: {config.f0_channels}",
    ]
    if feat_extractor is not None:
        lines.append(f"feat_extractor: {TAG_MEL}")
        lines += [f"    {key}: {_scalar(value)}" for key, value in feat_extractor.items()]
    return "\n".join(lines) + "\n"


__all__ = [
    "COSYVOICE_SEED",
    "REFERENCE_DEFAULTS",
    "TAG_CAUSAL_F0",
    "TAG_CAUSAL_HIFT",
    "TAG_MEL",
    "VocoderYaml",
    "read_vocoder_yaml",
    "render_vocoder_yaml",
]
