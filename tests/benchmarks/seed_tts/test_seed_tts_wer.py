# SPDX-License-Identifier: Apache-2.0
"""Seed-TTS normalisation, per-utterance WER and the official/strict aggregates, against hand-computed values."""

from __future__ import annotations

import types

import pytest

from vllm_omni_token2wav.benchmarks.seed_tts.wer import WordErrors, normalize_for_wer, summarize, word_errors

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


@pytest.mark.parametrize(
    ("text", "locale", "expected"),
    [
        # ASCII apostrophe survives, other ASCII punctuation goes, English is lowercased.
        ("Don't stop, Mr. Smith!", "en", "don't stop mr smith"),
        # U+2019 is in zhon's punctuation set, so the curly apostrophe is removed (the protocol's quirk).
        ("Don\u2019t", "en", "dont"),
        # Fullwidth apostrophe U+FF07 is removed as well.
        ("it\uff07s", "en", "its"),
        ("well-known", "en", "wellknown"),
        ("\u201cQuoted\u201d text\u2026", "en", "quoted text"),
        ("Hello,  World", "en", "hello world"),
        ("A \u2014 B", "en", "a b"),
        # Only ONE pass of "  " -> " ": three spaces become two (jiwer splits on any whitespace later).
        ("Three   spaces", "en", "three  spaces"),
        ("\u4f60\u597d\uff0c\u4e16\u754c\uff01", "zh", "\u4f60 \u597d \u4e16 \u754c"),
        ("\u300c\u6d4b\u8bd5\u300d\u3002", "zh", "\u6d4b \u8bd5"),
        # zh is not lowercased; Latin letters are split into characters like Hanzi.
        ("AI\u3001\u597d", "zh", "A I \u597d"),
    ],
)
def test_normalisation_follows_the_seed_tts_recipe(text: str, locale: str, expected: str) -> None:
    assert normalize_for_wer(text, locale) == expected


def test_normalisation_rejects_unknown_locale() -> None:
    with pytest.raises(ValueError, match="locale"):
        normalize_for_wer("x", "fr")


def test_word_errors_match_hand_alignment() -> None:
    # "the cat sat on the mat" vs "the cat sit on mat": sat->sit (S), one "the" deleted (D); 2 errors / 6 words.
    counts = word_errors("the cat sat on the mat", "the cat sit on mat")
    assert counts == WordErrors(substitutions=1, deletions=1, insertions=0, hits=4)
    assert counts.wer == pytest.approx(2 / 6)


def test_empty_hypothesis_is_all_deletions() -> None:
    counts = word_errors("one two three", "")
    assert (counts.deletions, counts.ref_words, counts.wer) == (3, 3, 1.0)


def test_empty_reference_is_an_error_not_a_number() -> None:
    with pytest.raises(ValueError, match="empty"):
        word_errors("  ", "hello")


def test_jiwer3_compute_measures_api_is_supported() -> None:
    calls = []

    def compute_measures(ref: str, hyp: str) -> dict[str, int]:
        calls.append((ref, hyp))
        return {"substitutions": 2, "deletions": 1, "insertions": 3, "hits": 7, "wer": 0.6}

    old_jiwer = types.SimpleNamespace(compute_measures=compute_measures)
    counts = word_errors("r", "h", jiwer_module=old_jiwer)
    assert calls == [("r", "h")]
    assert counts == WordErrors(2, 1, 3, 7)
    assert counts.wer == pytest.approx(6 / 10)


def test_jiwer_without_either_api_is_rejected() -> None:
    with pytest.raises(ImportError, match="process_words"):
        word_errors("a", "a", jiwer_module=types.SimpleNamespace())


def _row(status: str, s: int = 0, d: int = 0, i: int = 0, hits: int = 0, ref_words: int = 0, hyp: str = "x") -> dict:
    wer = (s + d + i) / ref_words if status == "ok" else None
    return {
        "status": status,
        "wer": wer,
        "substitutions": s,
        "deletions": d,
        "insertions": i,
        "hits": hits,
        "ref_words": ref_words,
        "hyp_norm": hyp,
    }


def test_official_and_strict_aggregates_match_hand_computed_values() -> None:
    rows = {
        "a": _row("ok", s=1, d=1, hits=4, ref_words=6),  # 2/6
        "b": _row("ok", hits=3, ref_words=3),  # 0
        "c": {"status": "missing_audio", "ref_words": 4},
        # "d" was never attempted (e.g. an interrupted run)
    }
    summary = summarize(rows, ["a", "b", "c", "d"])
    # official: mean(1/3, 0) = 16.667 %, median the same, corpus 2 / 9 = 22.222 %
    assert summary.official.as_dict() == {"n": 2, "wer_mean": 16.667, "wer_median": 16.667, "corpus_wer": 22.222}
    # strict: mean(1/3, 0, 1, 1) = 58.333 %, median(0, 1/3, 1, 1) = 66.667 %, corpus (2 + 4) / (9 + 4)
    assert summary.strict.n == 4
    assert summary.strict.wer_mean == 58.333
    assert summary.strict.wer_median == 66.667
    assert summary.strict.corpus_wer == round(100 * 6 / 13, 3)
    assert summary.counts["missing_audio"] == 1 and summary.counts["not_attempted"] == 1
    assert summary.counts["ok"] == 2 and summary.counts["expected"] == 4


def test_empty_transcriptions_are_counted_and_scored() -> None:
    rows = {"a": _row("ok", d=2, ref_words=2, hyp="")}
    summary = summarize(rows, ["a"])
    assert summary.counts["empty_transcription"] == 1
    assert summary.official.wer_mean == 100.0


def test_no_scored_rows_gives_empty_official_view() -> None:
    summary = summarize({"a": {"status": "asr_failed", "ref_words": 3}}, ["a"])
    assert summary.official.as_dict() == {"n": 0, "wer_mean": None, "wer_median": None, "corpus_wer": None}
    assert summary.strict.wer_mean == 100.0
