# SPDX-License-Identifier: Apache-2.0
"""Reading Seed-TTS meta.lst files: fields, relative paths, subsets, and errors that name file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_omni_token2wav.benchmarks.seed_tts.dataset import MetaFormatError, load_seed_tts_meta
from vllm_omni_token2wav.benchmarks.seed_tts.demo import demo_meta_path

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def _write(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "en"
    folder.mkdir(exist_ok=True)
    meta = folder / "meta.lst"
    meta.write_text(text, encoding="utf-8")
    return meta


def test_fields_and_paths_relative_to_the_meta_folder(tmp_path: Path) -> None:
    meta = _write(
        tmp_path,
        "# comment\n\nu1|hello there|prompts/u1.wav|General Kenobi.\nu2|p two|p2.wav|target two|gt/u2.wav\n",
    )
    ds = load_seed_tts_meta(meta, "en")
    assert [it.utt for it in ds.items] == ["u1", "u2"]
    first, second = ds.items
    assert first.prompt_text == "hello there" and first.target_text == "General Kenobi."
    assert first.prompt_wav == (tmp_path / "en" / "prompts" / "u1.wav").resolve()
    assert first.gt_wav is None and first.line_no == 3
    assert second.gt_wav == (tmp_path / "en" / "gt" / "u2.wav").resolve()
    assert ds.total_lines == 2 and not ds.bad_lines


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("u1|only|three", "expected 4 or 5"),
        ("u1|a|b.wav|c|d|e", "got 6"),
        ("|a|b.wav|c", "empty utterance id"),
        ("u1|a|b.wav|   ", "empty target text"),
        ("u1|a||text", "empty prompt wav"),
        ("../x|a|b.wav|text", "path separator"),
    ],
)
def test_malformed_line_error_names_file_and_line(tmp_path: Path, line: str, match: str) -> None:
    meta = _write(tmp_path, f"ok|a|a.wav|fine\n{line}\n")
    with pytest.raises(MetaFormatError, match=match) as info:
        load_seed_tts_meta(meta)
    assert f"{meta}:2:" in str(info.value)


def test_duplicate_utterance_is_rejected(tmp_path: Path) -> None:
    meta = _write(tmp_path, "u1|a|a.wav|one\nu1|b|b.wav|two\n")
    with pytest.raises(MetaFormatError, match="duplicate utterance id 'u1' \\(first on line 1\\)"):
        load_seed_tts_meta(meta)


def test_skip_bad_lines_counts_what_was_dropped(tmp_path: Path) -> None:
    meta = _write(tmp_path, "u1|a|a.wav|one\nbroken line\nu2|b|b.wav|two\nu3|c\n")
    ds = load_seed_tts_meta(meta, skip_bad_lines=True)
    assert [it.utt for it in ds.items] == ["u1", "u2"]
    assert [b.line_no for b in ds.bad_lines] == [2, 4]
    assert ds.total_lines == 4


def test_shuffle_and_subset_are_reproducible(tmp_path: Path) -> None:
    meta = _write(tmp_path, "".join(f"u{i}|p|p.wav|text {i}\n" for i in range(10)))
    a = [it.utt for it in load_seed_tts_meta(meta, shuffle=True, seed=3, subset=4).items]
    b = [it.utt for it in load_seed_tts_meta(meta, shuffle=True, seed=3, subset=4).items]
    plain = [it.utt for it in load_seed_tts_meta(meta, subset=4).items]
    assert a == b and len(a) == 4
    assert plain == ["u0", "u1", "u2", "u3"]
    assert a != plain  # seed 3 moves at least one of the first four away


def test_missing_prompt_wavs_are_reported_when_required(tmp_path: Path) -> None:
    meta = _write(tmp_path, "u1|a|a.wav|one\nu2|b|b.wav|two\n")
    (tmp_path / "en" / "a.wav").write_bytes(b"RIFF")
    ds = load_seed_tts_meta(meta)  # scoring does not need prompts
    assert [it.utt for it in ds.missing_prompt_wavs()] == ["u2"]
    with pytest.raises(FileNotFoundError, match="1 prompt wav\\(s\\) missing, first .*b.wav \\(line 2, utt u2\\)"):
        load_seed_tts_meta(meta, require_prompt_wavs=True)


def test_bad_arguments_and_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        load_seed_tts_meta(tmp_path / "nope.lst")
    meta = _write(tmp_path, "u1|a|a.wav|one\n")
    with pytest.raises(ValueError, match="locale"):
        load_seed_tts_meta(meta, "de")
    with pytest.raises(ValueError, match="subset"):
        load_seed_tts_meta(meta, subset=0)
    binary = tmp_path / "bin.lst"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(MetaFormatError, match="not UTF-8"):
        load_seed_tts_meta(binary)
    only_comments = _write(tmp_path, "# nothing\n")
    with pytest.raises(MetaFormatError, match="no usable utterances"):
        load_seed_tts_meta(only_comments)


def test_bundled_demo_set_is_a_valid_english_meta() -> None:
    ds = load_seed_tts_meta(demo_meta_path(), "en")
    assert len(ds) >= 20 and not ds.bad_lines
    assert len({it.target_text for it in ds.items}) == len(ds)
