# SPDX-License-Identifier: Apache-2.0
"""The console script: --help, --version, user errors without tracebacks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vllm_omni_token2wav.version import __version__

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vllm_omni_token2wav", *args], capture_output=True, text=True, timeout=120
    )


def test_help_lists_bench() -> None:
    proc = _cli("--help")
    assert proc.returncode == 0, proc.stderr
    assert "bench" in proc.stdout and "usage: vllm-omni-token2wav" in proc.stdout


def test_version() -> None:
    proc = _cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"vllm-omni-token2wav {__version__}"


def test_bench_without_benchmark_prints_usage_and_fails() -> None:
    proc = _cli("bench")
    assert proc.returncode == 2
    assert "usage: vllm-omni-token2wav bench" in proc.stderr


def test_unknown_option_is_a_usage_error_without_traceback() -> None:
    proc = _cli("--no-such-option")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "unrecognized arguments" in proc.stderr


def test_console_script_entry_point_is_declared() -> None:
    from importlib.metadata import entry_points

    scripts = {ep.name: ep.value for ep in entry_points(group="console_scripts")}
    assert scripts.get("vllm-omni-token2wav") == "vllm_omni_token2wav.entrypoints.cli.main:main"


def test_help_names_the_logging_level_variable() -> None:
    proc = _cli("--help")
    assert proc.returncode == 0 and "VLLM_OMNI_TOKEN2WAV_LOGGING_LEVEL" in proc.stdout


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["bench", "seed-tts", "score", "--bogus"], "usage: vllm-omni-token2wav bench seed-tts score"),
        (["bench", "spk-embedding", "--bogus"], "usage: vllm-omni-token2wav bench spk-embedding"),
        (["token2wav", "--tokens", "1", "--out", "a.wav", "--bogus"], "usage: vllm-omni-token2wav token2wav"),
    ],
)
def test_an_unknown_option_shows_the_usage_of_the_subcommand_it_was_given_to(
    argv: list[str], usage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from vllm_omni_token2wav.entrypoints.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith(usage) and "unrecognized arguments: --bogus" in err and "Traceback" not in err
