# SPDX-License-Identifier: Apache-2.0
"""A toy tokenizer with a real checkpoint's vocabulary size and special-token ids, generated offline.

Upstream's thinker/talker classes hard-code token ids (Step-Audio2's audio ids from 151696, MiniCPM-o's
turn terminators 151645/151704, `tts_bos` 151703, ...), and vLLM checks that the tokenizer covers the
model's vocabulary. A real tokenizer cannot be downloaded here, so the toy folders carry one built with
the `tokenizers` package (installed with vLLM):

- byte-level BPE without merges: any text encodes, one token per UTF-8 byte (ids 0-255);
- a filler token `<|toy_N|>` at every other id below `vocab_size`, so every id a random model samples
  decodes (vLLM's detokenizer must not fail on any sampled id);
- the family's special tokens at their real ids (added as special tokens, so `convert_tokens_to_ids` and
  prompt texts such as `<|im_start|>` resolve to the ids upstream's code expects);
- optionally a chat template (served chat completions render messages through it).

`write_toy_tokenizer` writes `tokenizer.json` and `tokenizer_config.json`; the output is a pure function
of the arguments (deterministic bytes), so cached folders stay stable.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

__all__ = ["BYTE_TOKENS", "filler_token", "toy_tokenizer_files", "write_toy_tokenizer"]

#: Ids 0-255 are the byte-level alphabet.
BYTE_TOKENS = 256


def filler_token(token_id: int) -> str:
    """The filler token at `token_id` (decodes to this text: never produced by encoding)."""
    return f"<|toy_{token_id}|>"


def _check(vocab_size: int, special_tokens: Mapping[str, int]) -> None:
    if vocab_size <= BYTE_TOKENS:
        raise ValueError(f"vocab_size must exceed the {BYTE_TOKENS} byte tokens, got {vocab_size}")
    seen: dict[int, str] = {}
    for name, token_id in special_tokens.items():
        if not BYTE_TOKENS <= int(token_id) < vocab_size:
            raise ValueError(
                f"special token {name!r} at id {token_id}: expected an id in [{BYTE_TOKENS}, {vocab_size}) "
                "(ids below 256 are the byte alphabet)"
            )
        if int(token_id) in seen:
            raise ValueError(f"special tokens {seen[int(token_id)]!r} and {name!r} share id {token_id}")
        seen[int(token_id)] = name


def toy_tokenizer_files(
    vocab_size: int, special_tokens: Mapping[str, int], *, chat_template: str | None = None
) -> dict[str, bytes]:
    """`{file name: bytes}` of the toy tokenizer (see the module docstring)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    _check(vocab_size, special_tokens)
    by_id = {int(i): name for name, i in special_tokens.items()}
    vocab = {symbol: i for i, symbol in enumerate(sorted(ByteLevel.alphabet()))}
    assert len(vocab) == BYTE_TOKENS
    for token_id in range(BYTE_TOKENS, vocab_size):
        vocab[by_id.get(token_id, filler_token(token_id))] = token_id
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    ordered = sorted(by_id.items())
    tokenizer.add_special_tokens([AddedToken(name, special=True, normalized=False) for _, name in ordered])
    for token_id, name in ordered:
        got = tokenizer.token_to_id(name)
        if got != token_id:  # the library would have appended it instead of using the vocabulary's id
            raise AssertionError(f"special token {name!r} landed at id {got}, expected {token_id}")
    names = dict(special_tokens)
    eos = next((n for n in ("<|endoftext|>", "<|im_end|>", "</s>") if n in names), None)
    config: dict[str, object] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
    }
    if eos is not None:
        config["eos_token"] = eos
        config["pad_token"] = eos
    if chat_template is not None:
        config["chat_template"] = chat_template
    return {
        "tokenizer.json": tokenizer.to_str().encode(),
        "tokenizer_config.json": (json.dumps(config, indent=1, sort_keys=True) + "\n").encode(),
    }


def write_toy_tokenizer(
    folder: Path, vocab_size: int, special_tokens: Mapping[str, int], *, chat_template: str | None = None
) -> None:
    """Write the toy tokenizer's `tokenizer.json` and `tokenizer_config.json` into `folder` (created)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in toy_tokenizer_files(vocab_size, special_tokens, chat_template=chat_template).items():
        (folder / name).write_bytes(data)
