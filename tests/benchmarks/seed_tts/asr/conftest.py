# SPDX-License-Identifier: Apache-2.0
"""A real (random-weight) transformers Whisper built offline from a tiny config, with a byte-level tokenizer.

Nothing is downloaded: the vocabulary is the 256 byte symbols plus Whisper's special tokens and 1501
timestamp tokens, so `generate` exercises the real prompt handling (language/task, forced decoder ids,
long-form timestamps) that the retry logic depends on.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest

SPECIALS = [
    "<|endoftext|>",
    "<|startoftranscript|>",
    "<|en|>",
    "<|zh|>",
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nospeech|>",
    "<|notimestamps|>",
]


def _byte_symbols() -> list[str]:
    """The byte-level BPE alphabet: printable bytes map to themselves, the rest to code points from 256 up."""
    printable = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    out, extra = [], 0
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


@dataclass
class TinyWhisper:
    model: Any
    feature_extractor: Any
    tokenizer: Any
    ids: dict[str, int]
    multilingual_config: Any
    english_only_config: Any


def _make_end_of_text_win(model: Any, eos: int) -> None:
    """Rig the decoder so <|endoftext|> has the largest logit whatever the input.

    The final layer norm outputs a constant vector along the eos row of the output projection, and that row
    is made 10x longer than any other, so eos wins every argmax the logits processors leave open. Long-form
    decoding then moves a whole 30 s window per pass (a random model emits random timestamps and crawls).
    """
    import torch

    with torch.no_grad():
        weight = model.proj_out.weight
        longest = weight.norm(dim=1).max()
        direction = weight[eos] / weight[eos].norm()
        weight[eos] = direction * 10.0 * longest
        norm = model.model.decoder.layer_norm
        norm.weight.zero_()
        norm.bias.copy_(direction)


@pytest.fixture(scope="session")
def tiny_whisper() -> TinyWhisper:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    vocab = {sym: i for i, sym in enumerate(_byte_symbols())}
    specials = SPECIALS + [f"<|{0.02 * i:.2f}|>" for i in range(1501)]
    for tok in specials:
        vocab[tok] = len(vocab)
    tokenizer = transformers.WhisperTokenizer(
        vocab=vocab,
        merges=[],
        unk_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=specials[1:],
    )
    ids = {tok: vocab[tok] for tok in SPECIALS}
    config = transformers.WhisperConfig(
        vocab_size=len(vocab),
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        num_mel_bins=80,
        max_source_positions=1500,
        max_target_positions=64,
        decoder_start_token_id=ids["<|startoftranscript|>"],
        pad_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|endoftext|>"],
        bos_token_id=ids["<|endoftext|>"],
    )
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(config).to(torch.float32).eval()
    _make_end_of_text_win(model, ids["<|endoftext|>"])
    gen = model.generation_config
    gen.max_new_tokens = 4
    gen.max_length = None
    gen.no_timestamps_token_id = ids["<|notimestamps|>"]
    gen.max_initial_timestamp_index = 50
    multilingual = copy.deepcopy(gen)
    multilingual.is_multilingual = True
    multilingual.lang_to_id = {"<|en|>": ids["<|en|>"], "<|zh|>": ids["<|zh|>"]}
    multilingual.task_to_id = {"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]}
    english_only = copy.deepcopy(gen)
    english_only.is_multilingual = False
    return TinyWhisper(
        model=model,
        feature_extractor=transformers.WhisperFeatureExtractor(feature_size=80),
        tokenizer=tokenizer,
        ids=ids,
        multilingual_config=multilingual,
        english_only_config=english_only,
    )
