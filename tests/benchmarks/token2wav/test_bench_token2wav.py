# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav bench token2wav`: option errors, default sizes, one `--reduced --fast` run as typed.

The end-to-end run uses the reduced stand-in token2wav directory (every interface of the real one,
narrow layers), so it checks the report's shape and honesty (fields, finite timings, table, PNG,
stand-in labelling) rather than any speed.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.bench_cli import run_bench, run_bench_subprocess
from vllm_omni_token2wav.benchmarks.token2wav.cli import SUBCOMMAND, build_config
from vllm_omni_token2wav.cli_types import CLIUsageError
from vllm_omni_token2wav.entrypoints.cli.main import main

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def e2e(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One real CLI run (subprocess) on the reduced stand-in with the --fast sizes, reports at their default place."""
    out = tmp_path_factory.mktemp("t2w_bench")
    proc = run_bench_subprocess(
        out, "token2wav", "--reduced", "--fast", "--device", "cpu", "--threads", "1", timeout=600, report_files=False
    )
    reports = out / "out"  # ./out/ of the working directory (git-ignored), not the working directory itself
    return {
        "proc": proc,
        "cwd": out,
        "json": reports / "token2wav_rtf_report.json",
        "png": reports / "token2wav_rtf_report.png",
    }


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    SUBCOMMAND.add_cli_args(parser)
    return parser.parse_args(list(argv))


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    return run_bench(capsys, "token2wav", *args)


def test_fast_run_prints_the_table_and_writes_json_and_plot(e2e: dict[str, Any]) -> None:
    proc = e2e["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in ("whole", "stream", "RTF", "1st chunk", "prompt preparation", "STAND-IN", "--fast sizes"):
        assert needle in proc.stdout
    assert "wrote out/token2wav_rtf_report.json and out/token2wav_rtf_report.png" in proc.stdout
    assert sorted(p.name for p in e2e["cwd"].iterdir()) == ["out"]
    assert e2e["png"].read_bytes().startswith(PNG_SIGNATURE)


def test_fast_run_json_has_documented_fields_and_finite_positive_timings(e2e: dict[str, Any]) -> None:
    assert e2e["proc"].returncode == 0, e2e["proc"].stderr
    report = json.loads(e2e["json"].read_text())
    assert report["schema"] == "vllm-omni/bench-token2wav/1" and report["complete"] is True
    assert "bench token2wav --reduced --fast" in report["command"]
    cfg = report["config"]
    assert (cfg["plan"], cfg["gen_seconds"], cfg["n_timesteps"], cfg["runs"], cfg["threads"]) == ("fast", 1.2, 2, 1, 1)
    assert report["weights"]["kind"] == "stand-in (reduced size)"
    assert report["backends"]["serving_speaker"] == "onnxruntime-cpu"
    assert [c["case"] for c in report["prompt_prep"]] == ["ort", "device", "cached"]
    for case in report["prompt_prep"]:
        assert math.isfinite(case["median_ms"]) and case["median_ms"] > 0
    for mode in report["synthesis"]:
        for key in ("median_total_s", "rtf", "rtf_after_setup", "median_first_audio_s"):
            assert math.isfinite(mode[key]) and mode[key] > 0, (mode["mode"], key)
        split = mode["split_of_median_run_s"]
        assert sum(split.values()) == pytest.approx(mode["runs"][0]["total_s"], rel=1e-9)
    stream = next(m for m in report["synthesis"] if m["mode"] == "stream")
    assert stream["median_first_chunk_s"] > 0 and len(stream["median_chunks_s"]) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--reduced", "--model-dir", "."), "cannot be combined with --model-dir"),
        (("--gen-seconds", "0"), "--gen-seconds must be a positive"),
        (("--gen-seconds", "nan"), "--gen-seconds must be a positive"),
        (("--gen-seconds", "0.01"), "less than one 25 Hz speech token"),
        (("--prompt-seconds", "30"), "--prompt-seconds 30.0: must be in"),
        (("--n-timesteps", "0"), "--n-timesteps must be >= 1"),
        (("--runs", "0"), "--runs must be >= 1"),
        (("--threads", "0"), "--threads must be >= 1"),
        (("--warmup", "-1"), "--warmup must be >= 0"),
        (("--device", "tpu"), "expected auto, cpu, cuda[:i] or npu[:i]"),
        (("--device", "cuda:x"), "expected auto, cpu, cuda[:i] or npu[:i]"),
    ],
)
def test_option_mistakes_are_usage_errors(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(CLIUsageError, match=message.replace("[", r"\[").replace("]", r"\]")):
        build_config(_parse(*argv))


def test_model_dir_without_the_token2wav_files_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "flow.pt").write_bytes(b"")
    code, _, err = _cli(capsys, "--model-dir", str(tmp_path), "--json", str(tmp_path / "r.json"))
    assert code == 2 and "Traceback" not in err
    assert "missing campplus.onnx, speech_tokenizer_v2_25hz.onnx, flow.yaml, hift.pt" in err
    code, _, err = _cli(capsys, "--model-dir", str(tmp_path / "nope"))
    assert code == 2 and "no such directory" in err


def test_json_path_that_is_a_folder_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _cli(capsys, "--reduced", "--json", str(tmp_path))
    assert code == 2 and "is a folder" in err


def test_cpu_defaults_are_smaller_than_the_issue_sizes_and_explicit_options_win() -> None:
    cpu = build_config(_parse("--device", "cpu"))
    assert (cpu.plan, cpu.gen_seconds, cpu.n_timesteps, cpu.runs) == ("cpu", 2.0, 5, 3)
    explicit = build_config(_parse("--device", "cpu", "--gen-seconds", "10", "--n-timesteps", "10"))
    assert (explicit.gen_seconds, explicit.n_timesteps, explicit.runs) == (10.0, 10, 3)
    fast = build_config(_parse("--device", "cpu", "--fast", "--runs", "2"))
    assert (fast.plan, fast.gen_seconds, fast.runs) == ("fast", 1.2, 2)


def test_accelerator_defaults_follow_the_issue() -> None:
    config = build_config(_parse("--device", "cuda"))
    assert (config.plan, config.gen_seconds, config.n_timesteps, config.runs) == ("accelerator", 10.0, 10, 5)


def test_help_lists_the_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    assert exit_info.value.code == 0
    assert "token2wav" in capsys.readouterr().out


def test_cosyvoice3_report_runs_as_a_user_types_it(tmp_path: Path) -> None:
    proc = run_bench_subprocess(
        tmp_path,
        "token2wav",
        *("--family", "cosyvoice3", "--device", "cpu", "--threads", "1", "--chunks", "2", "--baseline-at", "1,2,50"),
        *("--gen-seconds", "0.6", "--prompt-seconds", "1", "--n-timesteps", "1", "--runs", "1", "--warmup", "0"),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CosyVoice3 code2wav" in proc.stdout and "Traceback" not in proc.stderr
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["config"]["baseline_at"] == [1, 2] and doc["config"]["hop_tokens"] == 25  # indices past --chunks dropped
    assert doc["weights"]["kind"].startswith("reduced stand-in")
    assert (tmp_path / "report.png").read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--family", "cosyvoice3", "--reduced"), "--reduced: not an option of --family cosyvoice3"),
        (("--full",), "--full: not an option of --family step_audio2 (add --family cosyvoice3)"),
        (("--family", "cosyvoice3", "--full", "--model-dir", "."), "cannot be combined with --model-dir"),
        (("--family", "cosyvoice3", "--model-dir", "."), "missing campplus.onnx"),
        (("--family", "cosyvoice3", "--baseline-at", "1,x"), "expected comma-separated chunk indices"),
        (("--family", "cosyvoice3", "--chunks", "0"), "--chunks must be >= 1"),
    ],
)
def test_cosyvoice3_usage_errors_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    code, _, err = _cli(capsys, *args)
    assert code == 2 and message in err and "Traceback" not in err
