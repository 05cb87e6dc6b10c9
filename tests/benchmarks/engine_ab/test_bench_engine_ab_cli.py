# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav bench engine-ab` options: help, plans, and every mistake a one-line usage error.

Parsing only: no server starts here (the engine run is `test_bench_engine_ab_engine.py`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tests.helpers.bench_cli import run_bench
from vllm_omni_token2wav.benchmarks.engine_ab.cli import FAMILY_NAMES, SUBCOMMAND, build_config, stem_for
from vllm_omni_token2wav.benchmarks.engine_ab.run import FAMILIES
from vllm_omni_token2wav.benchmarks.token2wav_serve.engine import missing_engine
from vllm_omni_token2wav.cli_types import CLIUsageError
from vllm_omni_token2wav.entrypoints.cli.main import main

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    SUBCOMMAND.add_cli_args(parser)
    return parser.parse_args(list(argv))


def test_help_lists_the_subcommand_and_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    assert exit_info.value.code == 0 and "engine-ab" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "engine-ab", "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    for option in (
        "--families",
        "--route",
        "--concurrency",
        "--requests",
        "--seconds",
        "--faults",
        "--no-faults",
        "--smoke",
    ):
        assert option in out, option


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--families", "qwen3"), "--families 'qwen3': expected distinct names of"),
        (("--families", "cosyvoice3,cosyvoice3"), "expected distinct names"),
        (("--concurrency", "1,x"), "expected comma-separated ints"),
        (("--concurrency", "0"), "expected distinct levels >= 1"),
        (("--requests", "0"), "--requests must be >= 1"),
        (("--seconds", "0.1"), r"--seconds must be in \[0.2, 60\]"),
        (("--route", "stream", "--families", "minicpmo_4_5"), "route stream: minicpmo_4_5 has no stand-in stream"),
        (("--route", "stream", "--families", "step_audio2", "--faults"), "the fault wave needs route alone"),
        (("--route", "pipeline", "--families", "cosyvoice3"), "route pipeline: cosyvoice3 has no toy upstream"),
        (("--route", "pipeline", "--families", "step_audio2", "--faults"), "the fault wave needs route alone"),
    ],
)
def test_option_mistakes_are_usage_errors(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(CLIUsageError, match=message):
        build_config(_parse(*argv))


def test_a_folder_as_output_file_is_refused_before_any_work(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_bench(capsys, "engine-ab", "--json", str(Path.cwd()))
    assert code == 2 and "is a folder" in err


def test_plans_and_explicit_options() -> None:
    assert FAMILY_NAMES == FAMILIES
    if missing_engine():
        with pytest.raises(CLIUsageError, match="bench engine-ab needs"):
            build_config(_parse())
        return
    default = build_config(_parse())
    assert (default.families, default.concurrency, default.audio_seconds, default.faults) == (
        FAMILIES,
        (1, 4, 8),
        2.0,
        True,
    )
    assert [default.requests_at(c) for c in (1, 4, 8)] == [2, 4, 8]
    smoke = build_config(_parse("--smoke", "--families", "step_audio2"))
    assert (smoke.families, smoke.concurrency, smoke.requests, smoke.faults, smoke.plan) == (
        ("step_audio2",),
        (1,),
        2,
        False,
        "smoke",
    )
    mine = build_config(_parse("--smoke", "--faults", "--concurrency", "2,3", "--seconds", "1.5"))
    assert (mine.concurrency, mine.faults, mine.tokens) == ((2, 3), True, 38)
    accel = build_config(_parse("--plan", "accelerator", "--no-faults"))
    assert (accel.concurrency, accel.faults) == ((1, 4, 8, 16, 32), False)
    assert default.route == "alone"
    stream = build_config(_parse("--route", "stream", "--families", "step_audio2"))
    assert (stream.route, stream.faults, stream.concurrency, stream.full_size) == ("stream", False, (1, 4, 8), False)
    assert build_config(_parse("--full-size")).full_size is True
    pipeline = build_config(_parse("--route", "pipeline", "--families", "step_audio2,minicpmo_4_5"))
    assert (pipeline.route, pipeline.faults, pipeline.families) == ("pipeline", False, ("step_audio2", "minicpmo_4_5"))


def test_the_recorder_names_the_families_it_ran() -> None:
    assert stem_for([]) == "engine_ab"
    assert stem_for(["--families", "step_audio2,cosyvoice3", "--smoke"]) == "engine_ab_step_audio2_cosyvoice3"
    assert stem_for(["--route", "stream", "--families", "step_audio2"]) == "engine_ab_stream_step_audio2"
    assert stem_for(["--route", "alone"]) == "engine_ab"
    full = ["--route", "stream", "--families", "cosyvoice3", "--full-size"]
    assert stem_for(full) == "engine_ab_stream_cosyvoice3_full"
    assert stem_for(["--route", "pipeline", "--families", "step_audio2"]) == "engine_ab_pipeline_step_audio2"
