# SPDX-License-Identifier: Apache-2.0
"""`write_toy_tokenizer`: the vocabulary size, special tokens at their ids, every id decodes, text round-trips."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_omni_token2wav.model_executor.models.standin.toy.tokenizer import (
    BYTE_TOKENS,
    filler_token,
    write_toy_tokenizer,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

SPECIALS = {"<|endoftext|>": 700, "<|im_start|>": 701, "<|im_end|>": 702, "<audio_patch>": 950}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("toytok")
    write_toy_tokenizer(folder, 1000, SPECIALS, chat_template="{{ messages[0]['content'] }}")
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def test_the_vocabulary_has_exactly_the_size_asked_for_with_the_specials_at_their_ids(tokenizer) -> None:
    assert len(tokenizer) == 1000
    for name, token_id in SPECIALS.items():
        assert tokenizer.convert_tokens_to_ids(name) == token_id
        assert tokenizer.convert_ids_to_tokens(token_id) == name
    assert tokenizer.eos_token == "<|endoftext|>"


def test_text_round_trips_byte_by_byte_and_specials_encode_to_their_ids(tokenizer) -> None:
    text = "Grüße, world! 你好"
    ids = tokenizer(f"<|im_start|>{text}<|im_end|>", add_special_tokens=False)["input_ids"]
    assert ids[0] == 701 and ids[-1] == 702
    assert len(ids) == len(text.encode()) + 2 and all(i < BYTE_TOKENS for i in ids[1:-1])
    assert tokenizer.decode(ids[1:-1]) == text


def test_every_id_decodes_fillers_included(tokenizer) -> None:
    assert tokenizer.decode([300, 999]) == filler_token(300) + filler_token(999)
    for token_id in range(BYTE_TOKENS, 1000):
        assert tokenizer.decode([token_id]), token_id


def test_the_chat_template_is_written(tokenizer) -> None:
    assert tokenizer.chat_template == "{{ messages[0]['content'] }}"


@pytest.mark.parametrize(
    ("specials", "match"),
    [
        ({"<x>": 5}, r"expected an id in \[256, 1000\)"),
        ({"<x>": 1000}, r"expected an id in \[256, 1000\)"),
        ({"<x>": 300, "<y>": 300}, "share id 300"),
    ],
)
def test_special_ids_outside_the_vocabulary_or_shared_are_refused(
    tmp_path: Path, specials: dict[str, int], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        write_toy_tokenizer(tmp_path, 1000, specials)


def test_the_files_are_deterministic(tmp_path: Path) -> None:
    write_toy_tokenizer(tmp_path / "a", 1000, SPECIALS)
    write_toy_tokenizer(tmp_path / "b", 1000, SPECIALS)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
