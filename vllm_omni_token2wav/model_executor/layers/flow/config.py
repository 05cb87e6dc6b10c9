# SPDX-License-Identifier: Apache-2.0
"""Read `flow.yaml` into the in-tree flow model without importing hyperpyyaml or `cosyvoice2`.

The shipped `flow.yaml` is a hyperpyyaml file whose only top-level key `flow:` is a tree of `!new:` tags:

| tag                                                                        | in-tree class                 |
|----------------------------------------------------------------------------|-------------------------------|
| `!new:cosyvoice2.flow.flow.CausalMaskedDiffWithXvec`                       | `flow.CausalMaskedDiffWithXvec` |
| `!new:cosyvoice2.transformer.upsample_encoder_v2.UpsampleConformerEncoderV2` | `encoder.UpsampleConformerEncoderV2` |
| `!new:cosyvoice2.flow.flow_matching.CausalConditionalCFM`                  | `cfm.CausalConditionalCFM`    |
| `!new:cosyvoice2.flow.decoder_dit.DiT`                                     | `dit.DiT`                     |

`model_loader.tagged_yaml` parses it as data (safe loader, tags kept as records, `!ref` resolved); each
known tag under `flow:` builds its class with the mapping as keyword arguments plus an explicit `dtype`
(never the process default, which vLLM sets to bf16 while loading). Any other tag there is an error
naming the tag and the file: this reader never imports a class named in YAML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import yaml

from vllm_omni_token2wav.model_executor.layers.flow.cfm import CausalConditionalCFM
from vllm_omni_token2wav.model_executor.layers.flow.dit import DiT
from vllm_omni_token2wav.model_executor.layers.flow.encoder import UpsampleConformerEncoderV2
from vllm_omni_token2wav.model_executor.layers.flow.flow import CausalMaskedDiffWithXvec
from vllm_omni_token2wav.model_executor.model_loader.tagged_yaml import Tagged, read_tagged_yaml, resolve_refs

TAG_FLOW = "!new:cosyvoice2.flow.flow.CausalMaskedDiffWithXvec"
TAG_ENCODER = "!new:cosyvoice2.transformer.upsample_encoder_v2.UpsampleConformerEncoderV2"
TAG_CFM = "!new:cosyvoice2.flow.flow_matching.CausalConditionalCFM"
TAG_DIT = "!new:cosyvoice2.flow.decoder_dit.DiT"

KNOWN_TAGS: dict[str, type[torch.nn.Module]] = {
    TAG_FLOW: CausalMaskedDiffWithXvec,
    TAG_ENCODER: UpsampleConformerEncoderV2,
    TAG_CFM: CausalConditionalCFM,
    TAG_DIT: DiT,
}

#: The Step-Audio2 / MiniCPM-o 4.5 `flow.yaml` hyperparameters (605 keys, 155,802,352 parameters).
REAL_FLOW_CONFIG: dict[str, Any] = {
    "input_size": 512,
    "output_size": 80,
    "spk_embed_dim": 192,
    "output_type": "mel",
    "vocab_size": 6561,
    "encoder": {
        "input_size": 512,
        "output_size": 512,
        "input_layer": "linear",
        "pre_lookahead_len": 3,
        "num_blocks": 6,
        "num_up_blocks": 4,
        "up_stride": 2,
        "up_scale_factor": 2,
        "attention_heads": 8,
        "pos_enc_layer_type": "rel_pos_espnet",
        "selfattention_layer_type": "rel_selfattn",
        "key_bias": True,
        "linear_units": 2048,
        "dropout_rate": 0.1,
        "positional_dropout_rate": 0.1,
        "attention_dropout_rate": 0.1,
        "normalize_before": True,
    },
    "decoder": {
        "inference_cfg_rate": 0.7,
        "estimator": {
            "in_channels": 320,
            "out_channels": 80,
            "mlp_ratio": 4.0,
            "depth": 16,
            "num_heads": 8,
            "head_dim": 64,
            "hidden_size": 512,
        },
    },
}

#: Same code, small dims and depths: for fast tests and small stand-ins (mel 80, speaker 192, vocab 6561 kept).
REDUCED_FLOW_CONFIG: dict[str, Any] = {
    **REAL_FLOW_CONFIG,
    "input_size": 64,
    "encoder": {
        **REAL_FLOW_CONFIG["encoder"],
        "input_size": 64,
        "output_size": 64,
        "num_blocks": 2,
        "num_up_blocks": 1,
        "attention_heads": 2,
        "linear_units": 128,
    },
    "decoder": {
        "inference_cfg_rate": 0.7,
        "estimator": {
            **REAL_FLOW_CONFIG["decoder"]["estimator"],
            "depth": 2,
            "num_heads": 2,
            "head_dim": 32,
            "hidden_size": 64,
        },
    },
}


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    return text.removesuffix("...").strip()


def render_flow_yaml(config: dict[str, Any]) -> str:
    """hyperpyyaml text for `config` (the layout of the shipped flow.yaml: `flow:` -> encoder, decoder -> estimator)."""

    def block(mapping: dict[str, Any], indent: int) -> list[str]:
        pad = " " * indent
        lines = []
        for key, value in mapping.items():
            if isinstance(value, dict):
                continue
            lines.append(f"{pad}{key}: {_scalar(value)}")
        return lines

    enc = config["encoder"]
    dec = config["decoder"]
    est = dec["estimator"]
    lines = [
        "# flow model (in-tree reader: vllm_omni_token2wav.model_executor.layers.flow.config)",
        f"flow: {TAG_FLOW}",
    ]
    lines += block(config, 4)
    lines += [f"    encoder: {TAG_ENCODER}", *block(enc, 8)]
    lines += [f"    decoder: {TAG_CFM}", *block(dec, 8)]
    lines += [f"        estimator: {TAG_DIT}", *block(est, 12)]
    return "\n".join(lines) + "\n"


def _build(node: Any, source: str, dtype: torch.dtype, noise_seed: int) -> Any:
    """Construct the known classes of a `Tagged` tree bottom-up (keyword arguments + explicit dtype)."""
    if isinstance(node, dict):
        return {key: _build(value, source, dtype, noise_seed) for key, value in node.items()}
    if isinstance(node, list):
        return [_build(value, source, dtype, noise_seed) for value in node]
    if not isinstance(node, Tagged):
        return node
    cls = KNOWN_TAGS.get(node.tag)
    if cls is None:
        known = ", ".join(sorted(KNOWN_TAGS))
        raise ValueError(
            f"{source}: unknown tag {node.tag!r} at line {node.line}; the in-tree flow reader "
            f"knows only {known} (it never imports classes named in YAML)"
        )
    if not isinstance(node.value, dict):
        raise ValueError(f"{source}: tag {node.tag!r} at line {node.line} must carry a mapping")
    kwargs = _build(node.value, source, dtype, noise_seed)
    extra: dict[str, Any] = {"dtype": dtype}
    if cls is CausalConditionalCFM:
        extra["noise_seed"] = noise_seed
    try:
        return cls(**kwargs, **extra)
    except TypeError as exc:
        raise ValueError(f"{source}: {node.tag} at line {node.line} has arguments {sorted(kwargs)}: {exc}") from exc


def build_flow_from_yaml(
    text_or_path: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    noise_seed: int = 0,
) -> CausalMaskedDiffWithXvec:
    """Build the (randomly initialised) flow model described by a flow.yaml path or its text."""
    source, doc = read_tagged_yaml(text_or_path, "flow.yaml")
    if not isinstance(doc, dict) or "flow" not in doc:
        raise ValueError(f"{source}: expected a top-level 'flow:' key, got {type(doc).__name__}")
    flow = _build(resolve_refs(doc["flow"], doc, source), source, dtype, noise_seed)
    if not isinstance(flow, CausalMaskedDiffWithXvec):
        raise ValueError(f"{source}: 'flow:' must be tagged {TAG_FLOW}, got {type(flow).__name__}")
    return flow


def build_flow(
    config: dict[str, Any], *, dtype: torch.dtype = torch.float32, noise_seed: int = 0
) -> CausalMaskedDiffWithXvec:
    """Build from a config dict shaped like `REAL_FLOW_CONFIG` (through the same YAML path)."""
    return build_flow_from_yaml(render_flow_yaml(config), dtype=dtype, noise_seed=noise_seed)
