# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav bench token2wav-serve`: one `--smoke` run as typed, its report's fields, option errors.

The run uses the reduced stand-in with the smoke sizes (two levels, two short requests each), so it
checks the report's shape and honesty (every documented field, finite numbers, both modes and the
ratio, the table, the PNG) rather than any speed.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.bench_cli import run_bench, run_bench_subprocess
from vllm_omni_token2wav.benchmarks.token2wav_serve.cli import SUBCOMMAND, build_config
from vllm_omni_token2wav.cli_types import CLIUsageError
from vllm_omni_token2wav.entrypoints.cli.main import main

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("t2w_serve")
    proc = run_bench_subprocess(out, "token2wav-serve", "--smoke", "--device", "cpu", timeout=600)
    return {"proc": proc, "json": out / "report.json", "png": out / "report.png"}


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    SUBCOMMAND.add_cli_args(parser)
    return parser.parse_args(list(argv))


def test_smoke_run_prints_the_table_and_writes_json_and_plot(smoke: dict[str, Any]) -> None:
    proc = smoke["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in ("audio s/s", "TTFP p50", "RTF p50", "underruns", "1-per-fwd", "ratio", "STAND-IN", "smoke plan"):
        assert needle in proc.stdout, needle
    assert f"wrote {smoke['json']} and {smoke['png']}" in proc.stdout
    assert smoke["png"].read_bytes().startswith(PNG_SIGNATURE)


def test_smoke_json_has_every_documented_field(smoke: dict[str, Any]) -> None:
    assert smoke["proc"].returncode == 0, smoke["proc"].stderr
    report = json.loads(smoke["json"].read_text())
    assert report["schema"] == "vllm-omni/bench-token2wav-serve/1" and report["complete"] is True
    assert "bench token2wav-serve --smoke" in report["command"]
    env = report["environment"]
    assert env["loadavg_start"] is not None and env["loadavg_end"] is not None and env["threads"] == 1
    assert report["config"]["plan"] == "smoke" and report["weights"]["kind"] == "stand-in (reduced size)"
    assert [level["concurrency"] for level in report["levels"]] == [1, 2]
    for level in report["levels"]:
        assert set(level["modes"]) == {"batched", "unbatched"}
        assert level["talker_bound_audio_s_per_s"] == level["concurrency"] * 100.0 / 25  # default 100 codes/s
        for mode in level["modes"].values():
            assert mode["errors"] == 0 and mode["requests"] == 2 and mode["audio_s"] > 0
            assert mode["throughput_audio_s_per_s"] > 0 and mode["underruns"] >= 0
            for key in ("ttfp_s", "rtf", "stall_s", "step_s"):
                assert set(mode[key]) == {"p50", "p90", "p99", "mean"} and math.isfinite(mode[key]["p50"])
            assert mode["peak_stream_own_bytes"] > 0 and mode["peak_shared_bytes"] > 0
            for request in mode["per_request"]:
                assert request["ttfp_s"] > 0 and request["rtf"] > 0 and request["chunks"] >= 2
        unbatched = level["modes"]["unbatched"]
        assert unbatched["rows_per_step"] == 1.0  # one request per forward, by construction
        ratio = level["ratio_batched_over_unbatched"]
        assert ratio["throughput_audio_s_per_s"] == pytest.approx(
            level["modes"]["batched"]["throughput_audio_s_per_s"] / unbatched["throughput_audio_s_per_s"]
        )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--full", "--model-dir", "."), "cannot be combined with --model-dir"),
        (("--concurrency", "1,x"), "expected comma-separated ints"),
        (("--concurrency", "4,4"), "expected distinct levels"),
        (("--audio-seconds", "5-2"), "expected S or MIN-MAX"),
        (("--requests", "0"), "--requests must be >= 1"),
        (("--talker-rate", "0"), "--talker-rate must be > 0"),
        (("--device", "tpu"), "expected auto, cpu, cuda[:i] or npu[:i]"),
        (("--clock", "cpu", "--threads", "2"), "the cpu clock needs --device cpu and 1 thread"),
    ],
)
def test_option_mistakes_are_usage_errors(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(CLIUsageError, match=message.replace("[", r"\[").replace("]", r"\]")):
        build_config(_parse(*argv))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--talker-rate", "50"), "--talker-rate does not apply to --engine: the served producer runs at its own rate"),
        (
            ("--voices", "2"),
            "--voices does not apply to --engine: the speech endpoint serves this model with its default",
        ),
        (("--threads", "2"), "--threads does not apply to --engine"),
        (("--full",), "--full does not apply to --engine"),
        (("--family", "minicpmo"), "--family minicpmo does not apply to --engine"),
        (("--device", "cuda"), "--device cuda does not apply to --engine"),
        (("--requests", "0"), "--requests must be >= 1"),
        (("--request-rate", "0"), "--request-rate must be > 0"),
    ],
)
def test_engine_option_mistakes_are_usage_errors_before_any_work(argv: tuple[str, ...], message: str) -> None:
    from vllm_omni_token2wav.benchmarks.token2wav_serve.cli import build_engine_config

    with pytest.raises(CLIUsageError, match=message.replace("[", r"\[").replace("]", r"\]")):
        build_engine_config(_parse("--engine", *argv))


def test_server_logs_needs_engine(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_bench(capsys, "token2wav-serve", "--server-logs", str(tmp_path))
    assert code == 2 and "--server-logs keeps the servers' logs of an --engine run; add --engine" in err


def test_plans_and_explicit_options(tmp_path: Path) -> None:
    cpu = build_config(_parse("--device", "cpu"))
    assert (cpu.plan, cpu.concurrency, cpu.threads, cpu.n_timesteps, cpu.reference_seconds) == (
        "cpu",
        (1, 4, 8),
        1,
        10,
        6.0,
    )
    full = build_config(_parse("--device", "cpu", "--full"))
    assert (full.plan, full.concurrency, full.full) == ("cpu-full", (1, 2, 4), True)
    gpu = build_config(_parse("--device", "cuda"))
    assert (gpu.plan, gpu.concurrency) == ("accelerator", (1, 8, 32))
    mine = build_config(
        _parse("--device", "cpu", "--smoke", "--concurrency", "3", "--audio-seconds", "2", "--threads", "2")
    )
    assert (mine.plan, mine.concurrency, mine.audio_seconds, mine.threads, mine.n_timesteps) == (
        "smoke",
        (3,),
        (2.0, 2.0),
        2,
        2,
    )
    with pytest.raises(CLIUsageError, match="no such directory"):
        build_config(_parse("--model-dir", str(tmp_path / "nope")))


def test_help_lists_the_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    assert exit_info.value.code == 0 and "token2wav-serve" in capsys.readouterr().out
    code, _, err = run_bench(capsys, "token2wav-serve", "--json", str(Path.cwd()))
    assert code == 2 and "is a folder" in err


def test_family_names_are_the_family_lists_and_the_old_spellings_still_run() -> None:
    """`--family` takes the family list's names (the CosyVoice2-flow families); `minicpmo` / `step-audio2`, the
    names recorded commands use, map to them; the default is MiniCPM-o."""
    from vllm_omni_token2wav.benchmarks.token2wav_serve.families import FAMILIES

    assert FAMILIES == ("minicpmo_4_5", "step_audio2")
    assert build_config(_parse()).family == "minicpmo_4_5"
    for given, expected in (
        ("minicpmo", "minicpmo_4_5"),
        ("step-audio2", "step_audio2"),
        ("step_audio2", "step_audio2"),
    ):
        assert build_config(_parse("--family", given)).family == expected
    with pytest.raises(SystemExit):
        _parse("--family", "cosyvoice3")  # not on the CosyVoice2 flow: argparse refuses it
