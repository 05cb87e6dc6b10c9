# SPDX-License-Identifier: Apache-2.0
"""What both `vllm-omni-token2wav bench` micro-benchmarks share: option checks, report files, the recorder step."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from vllm_omni_token2wav.benchmarks.bench_cli import (
    argv_device_type,
    check_at_least,
    check_device,
    check_output_files,
    option_value,
)
from vllm_omni_token2wav.benchmarks.common import MAX_DEFAULT_THREADS, default_threads, fmt, json_text, load_average
from vllm_omni_token2wav.cli_types import CLIUsageError
from vllm_omni_token2wav.entrypoints.cli.record import record_cli_run

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


@pytest.mark.parametrize("text", ["auto", " cpu ", "cuda", "cuda:1", "npu:0"])
def test_device_specs_of_every_platform_pass(text: str) -> None:
    assert check_device(text) == text.strip()


@pytest.mark.parametrize("text", ["tpu", "cuda:x", "npu:-1", "gpu:0"])
def test_other_device_specs_are_usage_errors(text: str) -> None:
    with pytest.raises(CLIUsageError, match=r"expected auto, cpu, cuda\[:i\] or npu\[:i\]"):
        check_device(text)


def test_counts_below_their_floor_are_usage_errors() -> None:
    check_at_least("--runs", None, 1)
    check_at_least("--warmup", 0, 0)
    with pytest.raises(CLIUsageError, match="--runs must be >= 1, got 0"):
        check_at_least("--runs", 0, 1)


def test_an_output_path_that_is_a_folder_is_a_usage_error(tmp_path: Path) -> None:
    check_output_files(argparse.Namespace(json=str(tmp_path / "r.json"), plot=None))
    with pytest.raises(CLIUsageError, match="--plot .*: is a folder; give a file name"):
        check_output_files(argparse.Namespace(json=None, plot=str(tmp_path)))


def test_default_threads_stay_within_the_cap() -> None:
    assert 1 <= default_threads() <= MAX_DEFAULT_THREADS


def test_load_average_is_three_rounded_numbers_or_none() -> None:
    load = load_average()
    assert load is None or (len(load) == 3 and all(round(v, 2) == v for v in load))


def test_unmeasured_values_render_as_a_dash_and_json_as_null() -> None:
    assert (fmt(None, ".2f"), fmt(math.nan, ".2f"), fmt(1.234, ".2f"), fmt(None, ".1f", "n/a")) == (
        "-",
        "-",
        "1.23",
        "n/a",
    )
    document = {"a": math.inf, "b": [1.0, math.nan, (2.0, -math.inf)], "c": {"d": 0.5, "e": "text"}}
    assert json.loads(json_text(document)) == {"a": None, "b": [1.0, None, [2.0, None]], "c": {"d": 0.5, "e": "text"}}


@pytest.mark.parametrize(
    ("argv", "device"),
    [(["--device", "cuda:1"], "cuda"), (["--device=npu"], "npu"), (["--device", "cpu", "--fast"], "cpu")],
)
def test_recorder_files_are_named_after_the_requested_device(argv: list[str], device: str) -> None:
    assert argv_device_type(argv) == device


def test_option_value_reads_both_spellings_and_the_last_one_wins() -> None:
    assert option_value(["--threads", "2", "--clock=cpu"], "--threads") == "2"
    assert option_value(["--threads", "2", "--clock=cpu"], "--clock") == "cpu"
    assert option_value(["--threads", "2", "--threads=4"], "--threads") == "4"
    assert option_value(["--threads"], "--threads") is None and option_value([], "--full") is None


@pytest.mark.parametrize(("code", "recorded"), [(0, True), (1, True), (2, False)])
def test_recorder_keeps_the_table_only_for_a_recorded_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], code: int, recorded: bool
) -> None:
    seen: list[list[str]] = []

    def fake_cli(args: list[str]) -> int:
        seen.append(args)
        print("the table")
        return code

    monkeypatch.setattr("vllm_omni_token2wav.entrypoints.cli.main.main", fake_cli)
    stem = tmp_path / "bench_cpu"
    assert record_cli_run(["bench", "x", "--fast"], stem, recorded_codes=(0, 1)) == code
    assert seen == [["bench", "x", "--fast", "--json", f"{stem}.json", "--plot", f"{stem}.png"]]
    assert Path(f"{stem}.txt").exists() is recorded
    if recorded:
        assert Path(f"{stem}.txt").read_text() == "the table\n"
    assert "the table" in capsys.readouterr().out
