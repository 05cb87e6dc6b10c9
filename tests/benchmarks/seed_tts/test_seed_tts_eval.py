# SPDX-License-Identifier: Apache-2.0
"""Scoring a folder of generated audio: failure rows, hand-checked summaries, resume and Ctrl-C safety.

The ASR here is a stand-in that "recognises" each file by its duration (each test file has a distinct
length), so the expected WER of every row is known by construction.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from vllm_omni_token2wav.benchmarks.seed_tts.dataset import load_seed_tts_meta
from vllm_omni_token2wav.benchmarks.seed_tts.evaluate import HISTOGRAM_FILE, SCORES_FILE, SUMMARY_FILE, score_generated
from vllm_omni_token2wav.benchmarks.seed_tts.results import JsonlLog, read_jsonl_rows

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

RATE = 16000


class DurationASR:
    """Maps a clip's duration (in hundredths of a second) to a transcription; counts calls."""

    name = "duration-stub"
    model_id = "stub"
    device = "cpu"
    locale = "en"

    def __init__(self, texts: dict[int, str], on_call: Callable[[int], None] | None = None) -> None:
        self.texts = texts
        self.calls: list[int] = []
        self.on_call = on_call

    def __call__(self, audio: np.ndarray) -> str:
        key = round(100 * len(audio) / RATE)
        self.calls.append(key)
        if self.on_call is not None:
            self.on_call(len(self.calls))
        return self.texts[key]


def _tone(path: Path, centiseconds: int) -> None:
    t = np.arange(centiseconds * RATE // 100) / RATE
    sf.write(path, (0.1 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), RATE, subtype="PCM_16")


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, Path, DurationASR]:
    """5 items: perfect, one substitution, missing wav, unreadable wav, empty transcription."""
    meta = tmp_path / "meta.lst"
    meta.write_text(
        "u1|p|p.wav|The cat sat on the mat.\n"
        "u2|p|p.wav|Turn left at the light.\n"
        "u3|p|p.wav|This one was never generated.\n"
        "u4|p|p.wav|This file is broken.\n"
        "u5|p|p.wav|Silence here.\n",
        encoding="utf-8",
    )
    gen = tmp_path / "gen"
    gen.mkdir()
    _tone(gen / "u1.wav", 50)
    _tone(gen / "u2.wav", 60)
    (gen / "u4.wav").write_bytes(b"RIFF\x00\x00not really a wav")
    _tone(gen / "u5.wav", 70)
    asr = DurationASR({50: "the cat sat on the mat", 60: "Turn right at the light!", 70: ""})
    return meta, gen, asr


def test_every_item_gets_a_row_and_the_summary_matches_hand_values(corpus, tmp_path: Path) -> None:
    meta, gen, asr = corpus
    out = tmp_path / "out"
    report = score_generated(load_seed_tts_meta(meta), gen, asr, out, histogram=True)
    rows = report.rows
    assert {u: r["status"] for u, r in rows.items()} == {
        "u1": "ok",
        "u2": "ok",
        "u3": "missing_audio",
        "u4": "unreadable_audio",
        "u5": "ok",
    }
    assert rows["u1"]["wer"] == 0.0
    assert rows["u2"]["wer"] == pytest.approx(1 / 5) and rows["u2"]["substitutions"] == 1
    assert rows["u5"]["wer"] == 1.0 and rows["u5"]["deletions"] == 2
    assert "cannot decode" in rows["u4"]["error"] and "u4.wav" in rows["u4"]["error"]
    assert rows["u3"]["ref_words"] == 5

    s = report.summary
    # official: mean(0, 0.2, 1.0) = 40 %, median 20 %, corpus (0 + 1 + 2) / (6 + 5 + 2) = 3/13
    assert s["official"] == {"n": 3, "wer_mean": 40.0, "wer_median": 20.0, "corpus_wer": round(300 / 13, 3)}
    # strict adds u3 (5 words) and u4 (4 words) at WER 1: mean(0, .2, 1, 1, 1) = 64 %, corpus 12 / 22
    assert s["strict"] == {"n": 5, "wer_mean": 64.0, "wer_median": 100.0, "corpus_wer": round(1200 / 22, 3)}
    assert s["counts"]["missing_audio"] == 1 and s["counts"]["unreadable_audio"] == 1
    assert s["counts"]["empty_transcription"] == 1
    assert s["headline_wer"] == 40.0 and s["interrupted"] is False
    assert json.loads((out / SUMMARY_FILE).read_text()) == s
    assert len((out / SCORES_FILE).read_text().splitlines()) == 5
    assert (out / HISTOGRAM_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert asr.calls == [50, 60, 70]


def test_interrupted_run_resumes_without_rescoring(corpus, tmp_path: Path) -> None:
    meta, gen, asr = corpus
    out = tmp_path / "out"
    dataset = load_seed_tts_meta(meta)

    def interrupt_on_second(n: int) -> None:
        if n == 2:
            raise KeyboardInterrupt

    first = DurationASR(asr.texts, on_call=interrupt_on_second)
    with pytest.raises(KeyboardInterrupt):
        score_generated(dataset, gen, first, out)
    partial = json.loads((out / SUMMARY_FILE).read_text())
    assert partial["interrupted"] is True and partial["counts"]["not_attempted"] == 4
    assert list(read_jsonl_rows(out / SCORES_FILE)) == ["u1"]
    # A torn row as a kill mid-write would leave it; resume must drop it and append cleanly.
    with (out / SCORES_FILE).open("ab") as fh:
        fh.write(b'{"utt": "u2", "stat')

    report = score_generated(dataset, gen, asr, out, resume=True)
    assert asr.calls == [60, 70]  # u1 was kept; u3/u4 fail without ASR
    assert report.summary["counts"]["ok"] == 3 and report.summary["counts"]["not_attempted"] == 0
    lines = (out / SCORES_FILE).read_text().splitlines()
    assert [json.loads(line)["utt"] for line in lines] == ["u1", "u2", "u3", "u4", "u5"]


def test_resume_retries_failures_once_the_audio_exists(corpus, tmp_path: Path) -> None:
    meta, gen, asr = corpus
    out = tmp_path / "out"
    dataset = load_seed_tts_meta(meta)
    score_generated(dataset, gen, asr, out)
    _tone(gen / "u3.wav", 80)
    asr.texts[80] = "this one was never generated"
    asr.calls.clear()
    report = score_generated(dataset, gen, asr, out, resume=True)
    assert asr.calls == [80]
    assert report.rows["u3"]["status"] == "ok" and report.rows["u3"]["wer"] == 0.0
    assert report.summary["counts"]["missing_audio"] == 0


def test_one_asr_error_is_a_row_but_a_broken_backend_stops(corpus, tmp_path: Path) -> None:
    meta, gen, asr = corpus
    del asr.texts[60]  # KeyError for u2 only
    report = score_generated(load_seed_tts_meta(meta), gen, asr, tmp_path / "a")
    assert report.rows["u2"]["status"] == "asr_failed" and "KeyError" in report.rows["u2"]["error"]
    assert report.rows["u5"]["status"] == "ok"

    many = tmp_path / "many.lst"
    many.write_text("".join(f"m{i}|p|p.wav|word {i}\n" for i in range(8)), encoding="utf-8")
    gen2 = tmp_path / "gen2"
    gen2.mkdir()
    for i in range(8):
        _tone(gen2 / f"m{i}.wav", 20 + i)
    broken = DurationASR({})
    with pytest.raises(RuntimeError, match="failed on the first 5 utterances"):
        score_generated(load_seed_tts_meta(many), gen2, broken, tmp_path / "b")
    assert len(broken.calls) == 5


def test_reference_that_normalises_to_nothing_is_a_data_error(tmp_path: Path) -> None:
    meta = tmp_path / "meta.lst"
    meta.write_text("ok|p|p.wav|fine\nbad|p|p.wav|?!...\n", encoding="utf-8")
    (tmp_path / "gen").mkdir()
    with pytest.raises(ValueError, match=r"meta.lst:2: target text of 'bad' is empty after Seed-TTS normalisation"):
        score_generated(load_seed_tts_meta(meta), tmp_path / "gen", DurationASR({}), tmp_path / "out")


def test_missing_generated_folder_is_reported(tmp_path: Path) -> None:
    meta = tmp_path / "meta.lst"
    meta.write_text("u|p|p.wav|text\n", encoding="utf-8")
    with pytest.raises(FileNotFoundError, match="generated-audio folder not found"):
        score_generated(load_seed_tts_meta(meta), tmp_path / "nope", DurationASR({}), tmp_path / "out")


def test_corrupted_log_line_before_the_end_is_an_error(tmp_path: Path) -> None:
    log = tmp_path / "scores.jsonl"
    log.write_text('{"utt": "a"}\nnot json\n{"utt": "b"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="scores.jsonl:2: not a JSON row"):
        read_jsonl_rows(log)


def test_log_rows_are_whole_lines_and_later_rows_win(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    with JsonlLog(path, resume=False) as log:
        log.append({"utt": "a", "status": "missing_audio"})
        log.append({"utt": "a", "status": "ok"})
    assert path.read_bytes().endswith(b"\n")
    assert read_jsonl_rows(path) == {"a": {"utt": "a", "status": "ok"}}
