# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3 flow hyperparameters: a frozen config, the real and reduced sizes, and the `cosyvoice3.yaml` reader.

Fun-CosyVoice3 keeps them in the `flow:` section of `cosyvoice3.yaml`, a hyperpyyaml file that also
describes the LLM, the vocoder and training parts. vLLM-Omni 0.30 hard-codes the values instead; this
reader takes them from the file when it is there (so a differently sized checkpoint fails loudly at
the config, not deep in a matmul) and `REAL_FLOW_CONFIG` otherwise. The file is read as data
(`model_loader.tagged_yaml`): these tags are recognised, and any other tag inside `flow:` is an error.

| tag                                                               | read into                        |
|-------------------------------------------------------------------|----------------------------------|
| `!new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT`                | vocab, sizes, token_mel_ratio    |
| `!new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer`   | pre-lookahead channels, length   |
| `!new:cosyvoice.flow.flow_matching.CausalConditionalCFM`          | `cfm_params` (CFG rate, solver)  |
| `!new:omegaconf.DictConfig`                                       | its `content:` mapping           |
| `!new:cosyvoice.flow.DiT.dit.DiT`                                 | estimator sizes, chunk size      |

Arguments that only matter for training (dropout, sigma_min, only_mask_loss, ...) are accepted and
ignored; unknown arguments are errors, as they would be for the reference constructors. Fixed by
the architecture and not configurable upstream either: the conv position embedding (kernel 31,
groups 16), the 256-d time embedding, the noise table (15000 frames), RoPE theta 1e4.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_omni_token2wav.model_executor.model_loader.tagged_yaml import Tagged, read_tagged_yaml, resolve_refs

TAG_FLOW = "!new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT"
TAG_PRE_LOOKAHEAD = "!new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer"
TAG_CFM = "!new:cosyvoice.flow.flow_matching.CausalConditionalCFM"
TAG_DICT_CONFIG = "!new:omegaconf.DictConfig"
TAG_DIT = "!new:cosyvoice.flow.DiT.dit.DiT"

#: Conv position embedding: kernel and groups (hard-coded in the reference `CausalConvPositionEmbedding`).
CONV_POS_KERNEL = 31
CONV_POS_GROUPS = 16


@dataclass(frozen=True)
class CosyVoice3FlowConfig:
    """Sizes of `CausalMaskedDiffWithDiT`. Defaults are Fun-CosyVoice3-0.5B's (330 keys, 332,257,088 params)."""

    vocab_size: int = 6561
    #: token embedding width; the pre-lookahead layer keeps it, so it is also mu's width
    input_size: int = 80
    #: mel bins (also the speaker projection's width and the estimator's output)
    output_size: int = 80
    spk_embed_dim: int = 192
    token_mel_ratio: int = 2
    pre_lookahead_len: int = 3
    pre_lookahead_channels: int = 1024
    inference_cfg_rate: float = 0.7
    dim: int = 1024
    depth: int = 22
    heads: int = 16
    dim_head: int = 64
    ff_mult: float = 2.0
    #: block-causal attention chunk in mel frames (streaming); 25 tokens x token_mel_ratio
    static_chunk_size: int = 50

    def __post_init__(self) -> None:
        problems = []
        positive = (
            "vocab_size",
            "input_size",
            "output_size",
            "spk_embed_dim",
            "token_mel_ratio",
            "dim",
            "depth",
            "heads",
        )
        for name in positive:
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be >= 1")
        if self.dim % CONV_POS_GROUPS:
            problems.append(
                f"dim={self.dim} must be a multiple of the conv position embedding's {CONV_POS_GROUPS} groups"
            )
        if self.dim_head < 2 or self.dim_head % 2:
            problems.append(f"dim_head={self.dim_head} must be even and >= 2 (it is also the rotary dimension)")
        if self.static_chunk_size < 1 or self.static_chunk_size % self.token_mel_ratio:
            problems.append(
                f"static_chunk_size={self.static_chunk_size} must be a positive multiple of "
                f"token_mel_ratio={self.token_mel_ratio} (chunks hold whole tokens)"
            )
        if self.pre_lookahead_len < 0:
            problems.append(f"pre_lookahead_len={self.pre_lookahead_len} must be >= 0")
        if not self.inference_cfg_rate > 0:
            problems.append(f"inference_cfg_rate={self.inference_cfg_rate} must be > 0")
        if problems:
            raise ValueError("CosyVoice3FlowConfig: " + "; ".join(problems))

    @property
    def chunk_tokens(self) -> int:
        """Tokens per block-causal chunk (25)."""
        return self.static_chunk_size // self.token_mel_ratio

    @property
    def ff_inner(self) -> int:
        return int(self.dim * self.ff_mult)


REAL_FLOW_CONFIG = CosyVoice3FlowConfig()

#: Same code and interfaces (80 mel, 192-d speaker, 6561 vocabulary, 50-frame chunks), small widths:
#: fast tests and the default benchmark stand-in. RoPE still rotates only head 0 (dim_head 16 of 64).
REDUCED_FLOW_CONFIG = dataclasses.replace(
    REAL_FLOW_CONFIG, pre_lookahead_channels=64, dim=64, depth=2, heads=4, dim_head=16
)

# Constructor arguments of the reference classes: the ones read, and the ones that only matter for training.
_ARGS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    TAG_FLOW: (
        frozenset(
            {"input_size", "output_size", "spk_embed_dim", "vocab_size", "token_mel_ratio", "pre_lookahead_len"}
            | {"pre_lookahead_layer", "decoder", "output_type"}
        ),
        frozenset({"input_frame_rate", "only_mask_loss", "decoder_conf"}),
    ),
    TAG_PRE_LOOKAHEAD: (frozenset({"in_channels", "channels", "pre_lookahead_len"}), frozenset()),
    TAG_CFM: (frozenset({"cfm_params", "estimator", "spk_emb_dim"}), frozenset({"in_channels", "n_spks"})),
    TAG_DIT: (
        frozenset({"dim", "depth", "heads", "dim_head", "ff_mult", "mel_dim", "mu_dim", "spk_dim", "out_channels"})
        | frozenset({"static_chunk_size", "long_skip_connection"}),
        frozenset({"dropout", "num_decoding_left_chunks"}),
    ),
}
_CFM_PARAMS = (
    frozenset({"solver", "t_scheduler", "inference_cfg_rate"}),
    frozenset({"sigma_min", "training_cfg_rate", "reg_loss_type"}),
)


def _arguments(node: Any, tag: str, source: str, where: str) -> dict[str, Any]:
    if not isinstance(node, Tagged) or node.tag != tag:
        got = node.tag if isinstance(node, Tagged) else type(node).__name__
        line = f" at line {node.line}" if isinstance(node, Tagged) else ""
        raise ValueError(f"{source}: {where} must be tagged {tag}, got {got}{line}")
    if not isinstance(node.value, dict):
        raise ValueError(f"{source}: {tag} at line {node.line} must carry a mapping")
    read, ignored = _ARGS[tag]
    unknown = sorted(set(node.value) - read - ignored)
    if unknown:
        raise ValueError(
            f"{source}: {tag} at line {node.line} has unknown arguments {unknown}; the reference constructor "
            "would reject them too (a typo?)"
        )
    return node.value


def _require(args: dict[str, Any], key: str, tag: str, source: str) -> Any:
    if key not in args:
        raise ValueError(f"{source}: {tag} lacks {key!r}; the in-tree reader needs every size explicitly")
    return args[key]


def _cfm_params(node: Any, source: str) -> dict[str, Any]:
    if isinstance(node, Tagged) and node.tag == TAG_DICT_CONFIG:
        node = node.value.get("content") if isinstance(node.value, dict) else None
    if not isinstance(node, dict):
        raise ValueError(f"{source}: cfm_params must be a mapping or {TAG_DICT_CONFIG} with a 'content:' mapping")
    read, ignored = _CFM_PARAMS
    unknown = sorted(set(node) - read - ignored)
    if unknown:
        raise ValueError(f"{source}: cfm_params has unknown entries {unknown}")
    if node.get("solver", "euler") != "euler" or node.get("t_scheduler", "cosine") != "cosine":
        raise ValueError(
            f"{source}: cfm_params solver={node.get('solver')!r}, t_scheduler={node.get('t_scheduler')!r}; "
            "the in-tree flow implements the reference's Euler solver on the cosine schedule only"
        )
    return node


def flow_config_from_yaml(text_or_path: str | Path) -> CosyVoice3FlowConfig:
    """The `flow:` section of a `cosyvoice3.yaml` path (or its text) as a `CosyVoice3FlowConfig`."""
    source, doc = read_tagged_yaml(text_or_path, "cosyvoice3.yaml")
    if not isinstance(doc, dict) or "flow" not in doc:
        raise ValueError(f"{source}: expected a top-level 'flow:' key, got {type(doc).__name__}")
    flow = resolve_refs(doc["flow"], doc, source)
    top = _arguments(flow, TAG_FLOW, source, "'flow:'")
    pre = _arguments(
        _require(top, "pre_lookahead_layer", TAG_FLOW, source), TAG_PRE_LOOKAHEAD, source, "pre_lookahead_layer"
    )
    cfm = _arguments(_require(top, "decoder", TAG_FLOW, source), TAG_CFM, source, "decoder")
    params = _cfm_params(_require(cfm, "cfm_params", TAG_CFM, source), source)
    dit = _arguments(_require(cfm, "estimator", TAG_CFM, source), TAG_DIT, source, "decoder.estimator")
    if top.get("output_type", "mel") != "mel":
        raise ValueError(f"{source}: output_type={top['output_type']!r} is not supported (only 'mel')")
    if dit.get("long_skip_connection"):
        raise ValueError(f"{source}: DiT long_skip_connection=True is not implemented (CosyVoice3 ships False)")

    def need(args: dict[str, Any], key: str, tag: str) -> Any:
        return _require(args, key, tag, source)

    config = CosyVoice3FlowConfig(
        vocab_size=int(need(top, "vocab_size", TAG_FLOW)),
        input_size=int(need(top, "input_size", TAG_FLOW)),
        output_size=int(need(top, "output_size", TAG_FLOW)),
        spk_embed_dim=int(need(top, "spk_embed_dim", TAG_FLOW)),
        token_mel_ratio=int(top.get("token_mel_ratio", 2)),
        pre_lookahead_len=int(top.get("pre_lookahead_len", 3)),
        pre_lookahead_channels=int(need(pre, "channels", TAG_PRE_LOOKAHEAD)),
        inference_cfg_rate=float(need(params, "inference_cfg_rate", "cfm_params")),
        dim=int(need(dit, "dim", TAG_DIT)),
        depth=int(need(dit, "depth", TAG_DIT)),
        heads=int(need(dit, "heads", TAG_DIT)),
        dim_head=int(need(dit, "dim_head", TAG_DIT)),
        ff_mult=float(need(dit, "ff_mult", TAG_DIT)),
        static_chunk_size=int(need(dit, "static_chunk_size", TAG_DIT)),
    )
    # Widths that must agree between the parts (the reference would fail with a shape error).
    agree = {
        "pre_lookahead_layer.in_channels": (pre.get("in_channels"), config.input_size),
        "pre_lookahead_layer.pre_lookahead_len": (pre.get("pre_lookahead_len"), config.pre_lookahead_len),
        "decoder.spk_emb_dim": (cfm.get("spk_emb_dim"), config.output_size),
        "estimator.mel_dim": (dit.get("mel_dim"), config.output_size),
        "estimator.mu_dim": (dit.get("mu_dim"), config.input_size),
        "estimator.spk_dim": (dit.get("spk_dim"), config.output_size),
        "estimator.out_channels": (dit.get("out_channels", config.output_size), config.output_size),
    }
    wrong = [f"{name}={got} (expected {want})" for name, (got, want) in agree.items() if got != want]
    if wrong:
        raise ValueError(f"{source}: flow parts disagree on widths: {', '.join(wrong)}")
    return config


def render_cosyvoice3_yaml(config: CosyVoice3FlowConfig) -> str:
    """A `cosyvoice3.yaml` with the shipped file's layout of the fixed parameters and the `flow:` section.

    Used for stand-in directories; other sections (hift, llm) are appended by whoever writes them.
    """
    c = config
    return f"""# CosyVoice3 hyperparameters (stand-in); read by vllm_omni_token2wav...models.cosyvoice3.flow.config
sample_rate: 24000
spk_embed_dim: {c.spk_embed_dim}
token_frame_rate: 25
token_mel_ratio: {c.token_mel_ratio}
chunk_size: {c.chunk_tokens}
num_decoding_left_chunks: -1

flow: {TAG_FLOW}
    input_size: {c.input_size}
    output_size: {c.output_size}
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: {c.vocab_size}
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: {c.pre_lookahead_len}
    pre_lookahead_layer: {TAG_PRE_LOOKAHEAD}
        in_channels: {c.input_size}
        channels: {c.pre_lookahead_channels}
        pre_lookahead_len: {c.pre_lookahead_len}
    decoder: {TAG_CFM}
        in_channels: {2 * c.output_size + c.input_size}
        n_spks: 1
        spk_emb_dim: {c.output_size}
        cfm_params: {TAG_DICT_CONFIG}
            content:
                sigma_min: 1.0e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: {c.inference_cfg_rate}
                reg_loss_type: 'l1'
        estimator: {TAG_DIT}
            dim: {c.dim}
            depth: {c.depth}
            heads: {c.heads}
            dim_head: {c.dim_head}
            ff_mult: {c.ff_mult:g}
            mel_dim: {c.output_size}
            mu_dim: {c.input_size}
            spk_dim: {c.output_size}
            out_channels: {c.output_size}
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>
"""
