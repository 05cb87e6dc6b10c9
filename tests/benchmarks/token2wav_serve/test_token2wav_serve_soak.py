# SPDX-License-Identifier: Apache-2.0
"""The soak report's arithmetic and verdict, without an engine: windows, RSS slopes, failures, the CLI's refusals.

Reports are built by hand (requests with known deliveries, memory samples on a known line), so every
expected value is worked out from the inputs; a synthetic failure must turn the verdict and the exit code.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from vllm_omni_token2wav.benchmarks.token2wav_serve import soak_report
from vllm_omni_token2wav.benchmarks.token2wav_serve.cli import SUBCOMMAND, build_soak_config, stem_for
from vllm_omni_token2wav.benchmarks.token2wav_serve.run import RequestResult
from vllm_omni_token2wav.benchmarks.token2wav_serve.soak import (
    MemorySample,
    SoakConfig,
    SoakReport,
    SoakRequest,
    least_squares_slope,
    process_tree,
    tree_breakdown,
    tree_memory_mb,
)
from vllm_omni_token2wav.cli_types import CLIUsageError

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

RATE = 24000
REPLY_SAMPLES = RATE  # 1 s replies (25 codes)


def _config(**overrides: object) -> dict[str, object]:
    cfg = {
        "requests": 4,
        "concurrency": 2,
        "burst_requests": 2,
        "burst_concurrency": 2,
        "window": 2,
        "rss_interval_s": 1.0,
        "tokens_per_request": 25,
        "plan": "soak",
    }
    cfg.update(overrides)
    return cfg


def _request(
    phase: str, index: int, arrival: float, first: float, last: float, samples: int = REPLY_SAMPLES
) -> SoakRequest:
    result = RequestResult(f"{phase}-{index}", 0, 25, arrival, arrival)
    result.deliveries = [(first, samples // 2), (last, samples - samples // 2)]
    return SoakRequest(phase, index, result, finished_s=last)


def _report() -> SoakReport:
    """Four sustained requests (two windows of two) and a burst of two, all whole; RSS on a line 100 + 6 MB/min."""
    report = SoakReport(config=_config())
    report.requests = [
        _request("sustained", 0, 0.0, 0.5, 1.0),
        _request("sustained", 1, 0.0, 1.5, 2.0),
        _request("sustained", 2, 1.0, 2.0, 3.0),
        _request("sustained", 3, 2.0, 4.0, 5.0),
        _request("burst", 0, 6.0, 6.5, 7.0),
        _request("burst", 1, 6.0, 7.0, 8.0),
    ]
    # RSS grows 0.1 MB per second (6 MB/min) and 1 MB per finished request: slopes known exactly
    report.memory = [MemorySample(t, "sustained", int(t), 100.0 + 0.1 * t, 50.0, 9) for t in (0.0, 1.0, 2.0, 3.0, 4.0)]
    report.memory.append(MemorySample(7.0, "burst", 6, 120.0, 50.0, 9))
    report.phases = {"sustained": {"concurrency": 2}, "burst": {"concurrency": 2}}
    report.complete = True
    return report


def test_windows_give_ttfp_throughput_and_rss_per_window() -> None:
    windows = _report().windows()
    assert [(w["phase"], w["first"], w["last"]) for w in windows] == [
        ("sustained", 0, 1),
        ("sustained", 2, 3),
        ("burst", 0, 1),
    ]
    first, second, burst = windows
    # window 0: TTFPs 0.5 and 1.5 -> p50 0.5 (nearest rank), p99 1.5; 2 s of audio over 0 -> 2 s
    assert first["ttfp_s"]["p50"] == pytest.approx(0.5) and first["ttfp_s"]["p99"] == pytest.approx(1.5)
    assert first["throughput_audio_s_per_s"] == pytest.approx(1.0) and first["failures"] == 0
    # window 1: TTFPs 1.0 and 2.0; 2 s of audio over 1 -> 5 s; RSS at t = 5: the last sample at or before, t = 4
    assert second["ttfp_s"]["p99"] == pytest.approx(2.0) and second["throughput_audio_s_per_s"] == pytest.approx(0.5)
    assert second["rss_mb_end"] == pytest.approx(100.4)
    assert burst["ttfp_s"]["p50"] == pytest.approx(0.5) and burst["rss_mb_end"] == pytest.approx(120.0)


def test_rss_slope_is_least_squares_per_minute_and_per_100_requests() -> None:
    mem = _report().memory_summary()
    assert mem["slope"]["mb_per_min"] == pytest.approx(6.0)
    assert mem["slope"]["mb_per_100_requests"] == pytest.approx(10.0)  # 0.1 MB per request finished
    assert mem["slope"]["samples"] == 5 and mem["slope"]["span_s"] == pytest.approx(4.0)
    assert mem["slope_second_half"]["mb_per_min"] == pytest.approx(6.0)  # samples t = 2, 3, 4
    assert mem["sustained"]["first_mb"] == pytest.approx(100.0) and mem["burst"]["peak_mb"] == pytest.approx(120.0)
    assert mem["pss_slope_mb_per_min"] == pytest.approx(0.0)
    # an independent check of the fit: points off the line, slope by the closed form
    xs, ys = [0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 2.0, 6.0]
    assert least_squares_slope(xs, ys) == pytest.approx(1.4)  # sxy 7 / sxx 5
    assert least_squares_slope([1.0], [2.0]) is None and least_squares_slope([1.0, 1.0], [2.0, 3.0]) is None


def test_a_clean_run_passes_and_says_so() -> None:
    report = _report()
    assert report.verdict() == {"passed": True, "failures": 0, "unfinished": 0, "reasons": []}
    text = soak_report.render_text(report)
    assert "verdict: PASS" in text and "MB per 100 requests" in text and "burst 0-1" in text


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [
        (lambda r: r.requests[2].result.errors.append("HTTP 500: boom"), "1 request(s) failed, first sustained-2"),
        (lambda r: r.requests[4].result.deliveries.pop(), "expected 24000"),  # a short reply is a failure
        (lambda r: setattr(r.requests[5], "finished_s", None), "1 planned request(s) did not finish"),
        (lambda r: r.requests.pop(), "1 planned request(s) did not finish"),  # never sent
        (lambda r: setattr(r, "stage_errors", 2), "the stage counted 2 error(s)"),
        (lambda r: setattr(r, "complete", False), "the run did not complete"),
    ],
)
def test_any_failure_fails_the_verdict(spoil: object, reason: str) -> None:
    report = _report()
    spoil(report)  # type: ignore[operator]
    verdict = report.verdict()
    assert verdict["passed"] is False and report.failed()
    assert any(reason in r for r in verdict["reasons"]), verdict["reasons"]
    assert "verdict: FAIL" in soak_report.render_text(report)
    assert report.to_dict()["verdict"]["passed"] is False


def test_a_failed_request_counts_in_its_window_not_in_its_latencies() -> None:
    report = _report()
    report.requests[0].result.errors.append("IncompleteRead")
    first = report.windows()[0]
    assert first["failures"] == 1 and first["ttfp_s"]["p50"] == pytest.approx(1.5)  # only request 1 counts


def test_json_and_plot_are_written(tmp_path: Path) -> None:
    report = _report()
    soak_report.write_json(report, tmp_path / "r.json")
    soak_report.write_plot(report, tmp_path / "r.png")
    import json

    data = json.loads((tmp_path / "r.json").read_text())
    assert data["schema"] == "vllm-omni/bench-token2wav-serve-soak/1" and len(data["memory_samples"]) == 6
    assert data["phases"]["sustained"]["finished"] == 4 and len(data["per_request"]) == 6
    assert (tmp_path / "r.png").read_bytes().startswith(b"\x89PNG")


def test_the_process_tree_of_this_process_is_measured() -> None:
    assert process_tree(os.getpid())[0] == os.getpid()
    mem = tree_memory_mb(os.getpid())
    assert mem is not None and mem["rss_mb"] > 10 and mem["processes"] >= 1
    mine = tree_breakdown(os.getpid())[0]
    assert mine["pid"] == os.getpid() and mine["name"] and mine["rss_mb"] > 10


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    SUBCOMMAND.add_cli_args(parser)
    return parser.parse_args(list(argv))


def test_cli_builds_the_soak_plan_and_refuses_what_does_not_apply() -> None:
    pytest.importorskip("vllm_omni")
    config = build_soak_config(_args("--engine", "--soak"))
    assert config == SoakConfig()
    assert (config.requests, config.concurrency, config.burst_requests, config.burst_concurrency) == (1000, 8, 128, 64)
    smoke = build_soak_config(_args("--engine", "--soak", "--smoke", "--requests", "12", "--audio-seconds", "1.6"))
    assert smoke.plan == "soak-smoke" and smoke.requests == 12 and smoke.audio_seconds == 1.6
    for argv, needle in (
        (("--soak",), "add --engine"),
        (("--engine", "--soak", "--concurrency", "4,8"), "one level"),
        (("--engine", "--soak", "--request-rate", "2"), "closed loop"),
        (("--engine", "--soak", "--talker-rate", "50"), "does not apply"),
        (("--engine", "--soak", "--burst-concurrency", "0"), "--burst-concurrency"),
    ):
        with pytest.raises(CLIUsageError, match=needle):
            build_soak_config(_args(*argv))
    with pytest.raises(CLIUsageError, match="add --engine --soak"):
        SUBCOMMAND.run(_args("--burst-requests", "4"))
    assert stem_for(["--engine", "--soak"]) == "token2wav_serve_soak"
