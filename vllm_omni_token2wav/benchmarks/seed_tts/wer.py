# SPDX-License-Identifier: Apache-2.0
"""Seed-TTS text normalisation, per-utterance WER and the two aggregate views (official, strict).

The published Seed-TTS numbers come from one specific recipe (BytedanceSpeech `seed-tts-eval`, run_wer.py):

1. Remove every character of `zhon.hanzi.punctuation + string.punctuation` except the ASCII apostrophe `'`
   from reference and hypothesis (so "don't" survives but "don’t" with U+2019 becomes "dont"; hyphens vanish,
   "well-known" -> "wellknown").
2. Replace double spaces by single ones.
3. English: lowercase. Chinese: put a space between every character, so the "WER" of zh is a CER.
4. Score each utterance with jiwer (whose default transform strips and splits on whitespace) and report the
   MEAN OF PER-UTTERANCE WER x100, rounded to 3 decimals; corpus WER is not the headline.

Any other normalisation (jiwer's `RemovePunctuation` strips `'`, Whisper's English normaliser rewrites
numbers) gives numbers that cannot be compared with published tables, so this module implements exactly
the recipe above, validated against hand-computed cases in tests/benchmarks/seed_tts/test_seed_tts_wer.py.

The official script silently skips utterances whose audio is missing; that hides a broken system. The
summary therefore carries both views: "official" (mean over scored utterances, like run_wer.py) and
"strict" (every expected utterance counts; one without a usable transcription scores WER 1.0, i.e. all
words deleted).
"""

from __future__ import annotations

import functools
import statistics
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

# Per-utterance statuses. Only "ok" rows have a WER; every other status is a failure that the strict view
# counts as WER 1.0 and the official view leaves out (as run_wer.py does for missing files).
STATUS_OK = "ok"
STATUS_MISSING_AUDIO = "missing_audio"
STATUS_UNREADABLE_AUDIO = "unreadable_audio"
STATUS_ASR_FAILED = "asr_failed"
FAILURE_STATUSES = (STATUS_MISSING_AUDIO, STATUS_UNREADABLE_AUDIO, STATUS_ASR_FAILED)


@functools.cache
def _removed_punctuation() -> str:
    try:
        from zhon.hanzi import punctuation as zh_punctuation
    except ImportError as exc:  # pragma: no cover - zhon is in the bench extra
        raise ImportError(
            "Seed-TTS normalisation needs the `zhon` package (its Chinese punctuation set is part of the "
            "protocol): pip install 'vllm-omni-token2wav[bench]'"
        ) from exc
    return "".join(ch for ch in zh_punctuation + string.punctuation if ch != "'")


def normalize_for_wer(text: str, locale: str) -> str:
    """Apply the Seed-TTS normalisation (module docstring, steps 1-3) for `locale` "en" or "zh"."""
    if locale not in ("en", "zh"):
        raise ValueError(f"locale must be 'en' or 'zh', got {locale!r}")
    out = text.translate(str.maketrans("", "", _removed_punctuation()))
    out = out.replace("  ", " ")
    if locale == "zh":
        return " ".join(out)
    return out.lower()


@dataclass(frozen=True)
class WordErrors:
    """Alignment counts of one reference/hypothesis pair (words; characters for zh)."""

    substitutions: int
    deletions: int
    insertions: int
    hits: int

    @property
    def ref_words(self) -> int:
        return self.substitutions + self.deletions + self.hits

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def wer(self) -> float:
        """(S + D + I) / N. Undefined for an empty reference: raises instead of inventing a value."""
        if self.ref_words == 0:
            raise ValueError("WER is undefined for an empty reference")
        return self.errors / self.ref_words


def word_errors(reference: str, hypothesis: str, *, jiwer_module: ModuleType | Any | None = None) -> WordErrors:
    """Align with jiwer 4 (`process_words`) or jiwer 3 / 2 (`compute_measures`, removed in 4.0).

    The texts are already normalised; jiwer's default transform only strips and splits on whitespace.
    `jiwer_module` exists so tests can check the shim against a module with the older API.
    """
    if not reference.strip():
        raise ValueError("reference is empty after normalisation; WER is undefined")
    jw = jiwer_module
    if jw is None:
        try:
            import jiwer as jw
        except ImportError as exc:
            raise ImportError("Seed-TTS scoring needs jiwer: pip install 'vllm-omni-token2wav[bench]'") from exc
    if hasattr(jw, "process_words"):
        out = jw.process_words(reference, hypothesis)
        return WordErrors(int(out.substitutions), int(out.deletions), int(out.insertions), int(out.hits))
    if hasattr(jw, "compute_measures"):
        m = jw.compute_measures(reference, hypothesis)
        return WordErrors(int(m["substitutions"]), int(m["deletions"]), int(m["insertions"]), int(m["hits"]))
    raise ImportError(f"unsupported jiwer module {jw!r}: it has neither process_words (4.x) nor compute_measures")


@dataclass(frozen=True)
class WERView:
    """One aggregate view. WER values are percentages (x100) rounded to 3 decimals like run_wer.py."""

    n: int
    wer_mean: float | None
    wer_median: float | None
    corpus_wer: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"n": self.n, "wer_mean": self.wer_mean, "wer_median": self.wer_median, "corpus_wer": self.corpus_wer}


def _percent(x: float | None) -> float | None:
    return None if x is None else round(100.0 * x, 3)


def _view(per_utt: list[float], errors: int, ref_words: int) -> WERView:
    if not per_utt:
        return WERView(0, None, None, None)
    return WERView(
        n=len(per_utt),
        wer_mean=_percent(statistics.fmean(per_utt)),
        wer_median=_percent(statistics.median(per_utt)),
        corpus_wer=_percent(errors / ref_words) if ref_words else None,
    )


@dataclass(frozen=True)
class WERSummary:
    official: WERView
    strict: WERView
    counts: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return {"official": self.official.as_dict(), "strict": self.strict.as_dict(), "counts": dict(self.counts)}


def summarize(rows: Mapping[str, Mapping[str, Any]], expected_utts: Iterable[str]) -> WERSummary:
    """Aggregate per-utterance rows (see `seed_tts_eval.ScoreRow`) over the expected utterances.

    official: mean/median of per-utterance WER over rows with status "ok" (run_wer.py's number), corpus WER
    = sum of errors / sum of reference words over the same rows.
    strict: every expected utterance; a failed or absent row scores WER 1.0 and adds its reference words as
    deletions to the corpus WER.
    """
    expected = list(dict.fromkeys(expected_utts))
    counts = {"expected": len(expected), STATUS_OK: 0, "empty_transcription": 0, "not_attempted": 0}
    counts.update({s: 0 for s in FAILURE_STATUSES})
    ok_wers: list[float] = []
    strict_wers: list[float] = []
    ok_errors = ok_ref = strict_errors = strict_ref = 0
    for utt in expected:
        row = rows.get(utt)
        status = row.get("status") if row else None
        ref_words = int(row.get("ref_words") or 0) if row else 0
        if row is not None and status == STATUS_OK:
            counts[STATUS_OK] += 1
            wer = float(row["wer"])
            errors = int(row["substitutions"]) + int(row["deletions"]) + int(row["insertions"])
            ok_wers.append(wer)
            strict_wers.append(wer)
            ok_errors += errors
            ok_ref += ref_words
            strict_errors += errors
            strict_ref += ref_words
            if not str(row.get("hyp_norm", "")).strip():
                counts["empty_transcription"] += 1
            continue
        if row is None:
            counts["not_attempted"] += 1
        else:
            counts[str(status)] = counts.get(str(status), 0) + 1
        strict_wers.append(1.0)
        strict_errors += ref_words
        strict_ref += ref_words
    return WERSummary(
        official=_view(ok_wers, ok_errors, ok_ref),
        strict=_view(strict_wers, strict_errors, strict_ref),
        counts=counts,
    )
