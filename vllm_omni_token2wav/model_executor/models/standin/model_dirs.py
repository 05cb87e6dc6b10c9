# SPDX-License-Identifier: Apache-2.0
"""Model folders the real engine serves on CPU: a family's stand-in assets laid out as its real folder.

vLLM builds every stage from a model folder: it needs a `config.json` it can parse, weight files
for the default loader, and (for a stage that owns its tokenizer and gets text) a tokenizer. A
real MiniCPM-o / Step-Audio2 / CosyVoice3 folder has all that around its token2wav assets; CI has
only the project's deterministic stand-in assets. This module wraps them:

| family         | token2wav assets (stand-ins)       | root `config.json`            | root weights              |
|----------------|------------------------------------|-------------------------------|---------------------------|
| `minicpmo_4_5` | `assets/token2wav/`, default voice | a minimal Qwen2 config: the   | `model.safetensors` with  |
|                | `assets/HT_ref_audio.wav`          | code2wav stage reads no field | one marker tensor (the    |
| `step_audio2`  | `token2wav/` (default voice inside)| of it; vLLM needs one         | stage drains it unused)   |
| `cosyvoice3`   | the folder itself                  | `{}`, as the real one (vLLM-  | none: the `.pt` assets    |
|                |                                    | Omni patches in its config)   | are the checkpoint        |

CosyVoice3's folder also gets `CosyVoice-BlankEN/` (the real folder's tokenizer subfolder; vLLM-Omni's
`CosyVoice3Model` multimodal processor needs a tokenizer, even for the code2wav stage), holding the
byte-level tokenizer described below.

plus `standin_producer/` (the `model_subdir` of the stand-in producer stage, `standin/producer.py`):
a toy Qwen2 config (head dim 64, float32, `token2wav_standin.codec_offset`), a byte-level BPE
tokenizer with the chat special tokens the families' prompts use, and a marker weight file (the
producer runs with `load_format: dummy`). Built from the cached stand-in assets (hard links),
deterministic, offline; `ensure_engine_model_dir` caches the result under `envs.cache_dir()`.
The tokenizer needs the `tokenizers` package (installed with vLLM).

The table's rows are not written here: each family's `family.py` declares its `StandinLayout` (asset
subfolder, which stand-in asset set, the root config's architecture, copies into `assets/`, a tokenizer
subfolder, the producer's codec offset), and every family of the family list
(`token2wav_stage/families.py`) gets a folder.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import MANIFEST_NAME, ensure_assembled
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import (
    StandinLayout,
    registered_families,
)

__all__ = [
    "PRODUCER_SUBDIR",
    "engine_families",
    "ensure_engine_model_dir",
    "marker_safetensors",
    "producer_codec_offset",
]

PRODUCER_SUBDIR = "standin_producer"
_VERSION = 1
_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tts_start>", "<|endofprompt|>")


def engine_families() -> tuple[str, ...]:
    """Every family with an engine stand-in folder: the registered families (`families.registered_families`)."""
    return tuple(f.name for f in registered_families())


def __getattr__(name: str) -> object:
    """`ENGINE_FAMILIES`: `engine_families()` under its table name, recomputed on access (PEP 562)."""
    if name == "ENGINE_FAMILIES":
        return engine_families()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _layout(family: str) -> StandinLayout:
    for entry in registered_families():
        if entry.name == family:
            return entry.standin
    raise ValueError(f"no engine stand-in for family {family!r}; choose one of {engine_families()}")


def producer_codec_offset(family: str) -> int:
    """Codec ids in the stand-in producer's vocabulary start here (the family's `StandinLayout`)."""
    return _layout(family).producer_codec_offset


def marker_safetensors() -> bytes:
    """A safetensors file with one float32 zero `standin.marker` (what the default loader needs to find)."""
    header = json.dumps({"standin.marker": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + b"\x00" * 4


def _qwen2_config(*, vocab_size: int, architectures: list[str], extra: dict | None = None) -> bytes:
    config = {
        "model_type": "qwen2",
        "architectures": architectures,
        "hidden_size": 128,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": vocab_size,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        **(extra or {}),
    }
    return (json.dumps(config, indent=1, sort_keys=True) + "\n").encode()


def _tokenizer_files() -> dict[str, bytes]:
    """A byte-level BPE tokenizer (256 byte tokens, no merges) plus the chat special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = {symbol: i for i, symbol in enumerate(sorted(ByteLevel.alphabet()))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(_SPECIAL_TOKENS))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 32768,
    }
    return {
        "tokenizer.json": tokenizer.to_str().encode(),
        "tokenizer_config.json": (json.dumps(config, indent=1, sort_keys=True) + "\n").encode(),
    }


def _asset_dir(layout: StandinLayout, reduced: bool, seed: int, upstream_compatible: bool) -> Path:
    if layout.assets == "cosyvoice3":
        if upstream_compatible:
            raise ValueError("upstream_compatible applies to the token2wav asset families (minicpmo_4_5, step_audio2)")
        from vllm_omni_token2wav.model_executor.models.standin.cosyvoice3_dir import ensure_standin_cosyvoice3_dir

        return ensure_standin_cosyvoice3_dir(reduced=reduced, seed=seed)
    from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import ensure_standin_token2wav_dir

    return ensure_standin_token2wav_dir(reduced=reduced, seed=seed, upstream_compatible=upstream_compatible)


def _asset_files(directory: Path) -> dict[str, Path]:
    """The asset files of an assembled stand-in folder (not its hidden manifest and lock files)."""
    assert MANIFEST_NAME.startswith(".")
    return {p.name: p for p in sorted(directory.iterdir()) if p.is_file() and not p.name.startswith(".")}


def ensure_engine_model_dir(
    family: str, *, reduced: bool = True, seed: int = 0, upstream_compatible: bool = False
) -> Path:
    """The cached engine model folder of `family` (see the module table), assembled when missing or stale.

    `upstream_compatible` (token2wav families, reduced): the token2wav folder of
    `ensure_standin_token2wav_dir(..., upstream_compatible=True)`, which vLLM-Omni's own stage classes load.
    """
    from vllm_omni_token2wav import envs

    layout = _layout(family)
    size = "reduced" if reduced else "full"
    if reduced and upstream_compatible:
        size = "reduced-upstream"
    root = envs.cache_dir("standins", f"engine-{family}-v{_VERSION}-{size}-seed{seed}")
    recipe = {"family": family, "version": _VERSION, "reduced": reduced, "seed": seed}
    if upstream_compatible:
        recipe["upstream_compatible"] = True
    assets = _asset_files(_asset_dir(layout, reduced, seed, upstream_compatible))
    root_files: dict[str, bytes] = {}
    if layout.root_config_arch is None:
        root_files["config.json"] = b"{}\n"
    else:
        root_files["config.json"] = _qwen2_config(vocab_size=8192, architectures=[layout.root_config_arch])
        root_files["model.safetensors"] = marker_safetensors()
    if layout.tokenizer_subdir:
        # e.g. vLLM-Omni registers a multimodal processor for `CosyVoice3Model` that needs a tokenizer, which
        # it finds in the folder's `CosyVoice-BlankEN/` (the real folder's Qwen tokenizer).
        ensure_assembled(root / layout.tokenizer_subdir, {}, recipe, _tokenizer_files())
    if layout.asset_subdir:
        ensure_assembled(root / layout.asset_subdir, assets, recipe, {})
        if layout.assets_copies:
            ensure_assembled(root / "assets", {name: assets[name] for name in layout.assets_copies}, recipe, {})
        ensure_assembled(root, {}, recipe, root_files)
    else:
        ensure_assembled(root, assets, recipe, root_files)
    offset = producer_codec_offset(family)
    producer = {
        "config.json": _qwen2_config(
            vocab_size=offset + 6656,
            architectures=["Token2WavStandinProducer"],
            extra={"token2wav_standin": {"family": family, "codec_offset": offset}},
        ),
        "model.safetensors": marker_safetensors(),
        **_tokenizer_files(),
    }
    ensure_assembled(root / PRODUCER_SUBDIR, {}, recipe, producer)
    return root


def main(argv: list[str] | None = None) -> int:
    """`python -m vllm_omni_token2wav.model_executor.models.standin.model_dirs FAMILY [--full]`: print the folder."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m vllm_omni_token2wav.model_executor.models.standin.model_dirs")
    parser.add_argument("family", choices=engine_families())
    parser.add_argument("--full", action="store_true", help="full-size stand-in weights (default: reduced)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--upstream-compatible",
        action="store_true",
        help="token2wav families: the speech tokenizer and HiFT at the size vLLM-Omni's own classes hard-code",
    )
    args = parser.parse_args(argv)
    folder = ensure_engine_model_dir(
        args.family, reduced=not args.full, seed=args.seed, upstream_compatible=args.upstream_compatible
    )
    print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
