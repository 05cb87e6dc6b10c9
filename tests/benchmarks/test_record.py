# SPDX-License-Identifier: Apache-2.0
"""`benchmarks/record.py NAME`: one entry for every recorded benchmark, files named as the records already are."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import all_recorders
from tests.helpers.recorder import REPO, record_script

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

#: The recorder scripts record.py replaced; each name still records the same files.
FORMER_SCRIPTS = (
    "causal_hift_stream",
    "cosyvoice3_flow_stream",
    "spk_embedding",
    "token2wav_cosyvoice3",
    "token2wav_row_cost",
    "token2wav_rtf",
    "token2wav_serve",
)
#: Recorders added since (`bench engine-ab`, `bench token2wav-serve --engine --soak`, the memory budget, replicas,
#: precision, `bench token2wav-serve --engine --edge`).
NEW_RECORDERS = (
    "engine_ab",
    "token2wav_serve_soak",
    "upstream_audio",
    "token2wav_memory_budget",
    "code2wav_replicas",
    "token2wav_precision",
    "token2wav_serve_edges",
)


@pytest.fixture
def fake_cli(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The CLI replaced by one that writes the JSON and PNG it is asked for and prints a table."""
    seen: list[list[str]] = []

    def cli(args: list[str]) -> int:
        seen.append(args)
        Path(args[args.index("--json") + 1]).write_text("{}")
        Path(args[args.index("--plot") + 1]).write_bytes(b"\x89PNG\r\n\x1a\n")
        print("the table")
        return 1 if "--mismatch" in args else 0

    monkeypatch.setattr("vllm_omni_token2wav.entrypoints.cli.main.main", cli)
    # a developer benchmark of the checkout runs through its own runner, with its own program name first
    monkeypatch.setattr(
        "vllm_omni_token2wav.entrypoints.cli.main.run_standalone", lambda sub, argv, prog: cli([prog, *argv])
    )
    return seen


def test_list_shows_every_former_recorder_script_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert record_script().main(["--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert sorted(listed) == sorted(FORMER_SCRIPTS + NEW_RECORDERS)


def test_an_unknown_name_or_no_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert record_script().main(["token2wav_rtff"]) == 2
    assert "unknown benchmark 'token2wav_rtff'" in capsys.readouterr().err
    assert record_script().main([]) == 2
    assert "usage: record.py NAME" in capsys.readouterr().err


@pytest.mark.parametrize("name", FORMER_SCRIPTS)
def test_default_record_of_each_name_is_a_file_already_under_results(name: str) -> None:
    stem = all_recorders()[name].stem_for([])
    assert (REPO / "benchmarks" / "results" / f"{stem}_cpu.json").is_file()


def test_tag_goes_after_the_device_and_is_not_passed_on(tmp_path: Path, fake_cli: list[list[str]]) -> None:
    argv = ["--tag", "full", "--full", "--device", "cpu", "--results-dir", str(tmp_path)]
    assert record_script().main(["cosyvoice3_flow_stream", *argv]) == 0
    stem = tmp_path / "cosyvoice3_flow_stream_cpu_full"
    assert fake_cli == [
        [
            "python -m benchmarks.cosyvoice3_flow_stream",
            "--full",
            "--device",
            "cpu",
            "--json",
            f"{stem}.json",
            "--plot",
            f"{stem}.png",
        ]
    ]
    assert Path(f"{stem}.txt").read_text() == "the table\n"


def test_a_parity_mismatch_of_spk_embedding_is_still_recorded(tmp_path: Path, fake_cli: list[list[str]]) -> None:
    argv = ["--mismatch", "--device", "cpu", "--results-dir", str(tmp_path)]
    assert record_script().main(["spk_embedding", *argv]) == 1
    assert (tmp_path / "spk_embedding_cpu.txt").read_text() == "the table\n"
    assert record_script().main(["token2wav_rtf", *argv]) == 1
    assert not (tmp_path / "token2wav_rtf_cpu.txt").exists()


def test_a_missing_option_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert record_script().main(["cosyvoice3_flow_stream", "--tag"]) == 2
    assert "--tag needs a value" in capsys.readouterr().err
