# SPDX-License-Identifier: Apache-2.0
"""`bench engine-ab`'s report on synthetic measurements: metrics per arm, the verdict, failures as data, files.

No engine here: the arms are built from `RequestResult`s whose delivery times are chosen, so every figure
the table, the JSON and the verdict show can be checked against arithmetic done by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from vllm_omni_token2wav.benchmarks.engine_ab import report as ab_report
from vllm_omni_token2wav.benchmarks.engine_ab.run import (
    BAD_CODE,
    BAD_POSITION,
    FAULT_INDEX,
    FAULT_REQUESTS,
    ArmLevel,
    ArmResult,
    EngineABConfig,
    EngineABReport,
    FamilyAB,
    fault_codes,
    first_error_line,
    level_order,
    request_codes,
    upstream_max_num_seqs,
    write_overlay,
)
from vllm_omni_token2wav.benchmarks.token2wav_serve.run import ModeRun, RequestResult

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

SAMPLES_1S = 24000


def _level(arm: str, latencies: list[float], *, failed: int = 0, rss: int = 100 << 20) -> ArmLevel:
    """Requests of 1 s of audio that all arrive at 0 and answer after `latencies`; `failed` more that fail."""
    run = ModeRun(arm)
    for i, t in enumerate(latencies):
        run.requests.append(RequestResult(f"r{i}", 0, 25, 0.0, 0.0, deliveries=[(t, SAMPLES_1S)]))
    for i in range(failed):
        run.requests.append(RequestResult(f"f{i}", 0, 25, 0.0, 0.0, errors=[f"HTTP 500: boom {i}"]))
    run.makespan_s = max(latencies, default=0.0)
    return ArmLevel(run, rss)


def _arm(name: str, levels: dict[int, ArmLevel], *, status: str = "ok", peak: int = 200 << 20) -> ArmResult:
    arm = ArmResult(name, 4, "somewhere stage 1", "0" if name == "upstream" else "1", status=status)
    arm.levels = levels
    arm.peak_rss_bytes = peak
    return arm


def _family(up: ArmResult, ours: ArmResult) -> FamilyAB:
    return FamilyAB("step_audio2", "/models/sa2", {"upstream": up, "ours": ours}, {1: ["upstream", "ours"]})


def test_level_metrics_follow_from_the_delivery_times() -> None:
    d = _level("ours", [0.5, 1.0, 2.0, 4.0], failed=1).to_dict()
    assert d["requests"] == 5 and d["failed"] == 1 and d["first_error"] == "HTTP 500: boom 0"
    assert d["audio_s"] == pytest.approx(4.0)  # the failed request delivered nothing
    assert d["throughput_audio_s_per_s"] == pytest.approx(4.0 / 4.0)
    assert d["ttfp_s"]["p50"] == pytest.approx(1.0) and d["ttfp_s"]["p99"] == pytest.approx(4.0)
    assert d["rtf"]["p50"] == pytest.approx(1.0)  # latency / 1 s of audio
    assert d["underruns"] == 0  # one delivery per request: nothing to run under


def test_the_verdict_gives_ours_over_upstream_per_level_ttfp_rss_and_failures() -> None:
    up = _arm("upstream", {1: _level("upstream", [1.0, 1.0]), 4: _level("upstream", [4.0] * 4)}, peak=400 << 20)
    ours = _arm("ours", {1: _level("ours", [0.5, 0.5]), 4: _level("ours", [1.0] * 4)}, peak=300 << 20)
    fam = _family(up, ours)
    cmp = ab_report.comparison(fam)
    # c=1: 2 s of audio in 0.5 s vs 1 s -> x2; c=4: 4 s in 1 s vs 4 s -> x4
    assert cmp["levels"]["1"]["throughput_ours_over_upstream"] == pytest.approx(2.0)
    assert cmp["levels"]["4"]["throughput_ours_over_upstream"] == pytest.approx(4.0)
    assert cmp["levels"]["4"]["ttfp_p50_ours_over_upstream"] == pytest.approx(0.25)
    assert cmp["peak_rss_ours_over_upstream"] == pytest.approx(0.75)
    assert cmp["failed"] == {"upstream": 0, "ours": 0}
    line = ab_report.verdict(fam)
    assert line.startswith("step_audio2: audio s/s ours/upstream x2.00 (c=1), x4.00 (c=4)")
    assert "TTFP p50 at c=4 x0.25" in line and "peak RSS x0.75" in line
    assert line.endswith("ours ahead on throughput at every level")
    up.max_num_seqs = 1  # Step-Audio2's deploy YAML: the rest of a level queues in the engine
    text = ab_report.render_text(EngineABReport(EngineABConfig(), families={"step_audio2": fam}))
    assert "- upstream at c = 4: the stage holds 1 request(s) at a time" in text
    assert "- ours at c" not in text


@pytest.mark.parametrize(
    ("ours_s", "upstream_s", "overall"),
    [([2.0, 2.0], [1.0, 1.0], "upstream ahead on throughput at every level"), ([2.0, 0.5], [1.0, 1.0], "mixed")],
)
def test_the_verdict_says_when_upstream_is_ahead_or_the_levels_disagree(
    ours_s: list[float], upstream_s: list[float], overall: str
) -> None:
    up = _arm("upstream", {c: _level("upstream", [t]) for c, t in zip((1, 4), upstream_s, strict=True)})
    ours = _arm("ours", {c: _level("ours", [t]) for c, t in zip((1, 4), ours_s, strict=True)})
    assert overall in ab_report.verdict(_family(up, ours))


def test_an_arm_that_did_not_start_is_reported_with_its_reason_not_compared() -> None:
    up = _arm("upstream", {}, status="start_failed", peak=0)
    up.reason = "the server exited with code 1 before it was ready; log /x/server_upstream.log:"
    up.first_error = 'AssertionError (s3tokenizer/utils.py:57 in _rename_weights: assert "blocks" in k)'
    ours = _arm("ours", {1: _level("ours", [0.5, 0.5], failed=1)}, status="partial")
    fam = _family(up, ours)
    line = ab_report.verdict(fam)
    assert line.startswith("step_audio2: no comparison, upstream start_failed: AssertionError (s3tokenizer")
    assert "ours 4.00 audio s/s at c=1, 1 failed of 3" in line
    assert (
        ab_report.comparison(fam)["levels"] == {} and ab_report.comparison(fam)["peak_rss_ours_over_upstream"] is None
    )
    report = EngineABReport(EngineABConfig(families=("step_audio2",), concurrency=(1,)), families={"step_audio2": fam})
    assert report.failed()
    text = ab_report.render_text(report)
    assert "| upstream | 4 | - | - |" in text and "first error: AssertionError (s3tokenizer" in text
    assert f"verdict: {line}" in text


def test_neither_arm_measured_and_ours_failing_alone_are_named() -> None:
    up = _arm("upstream", {}, status="requests_failed")
    up.reason = "its warm-up request failed: HTTP 500: EngineCore encountered an issue"
    ours = _arm("ours", {}, status="start_failed")
    ours.reason = "the server was not ready after 900 s"
    assert ab_report.verdict(_family(up, ours)) == (
        "step_audio2: neither arm measured (upstream requests_failed: its warm-up request failed: HTTP 500: "
        "EngineCore encountered an issue; ours start_failed: the server was not ready after 900 s)"
    )
    up2 = _arm("upstream", {1: _level("upstream", [1.0])})
    assert ab_report.verdict(_family(up2, ours)).startswith("step_audio2: no comparison, ours start_failed")


def test_json_table_and_png_carry_both_arms_faults_and_the_verdict(tmp_path: Path) -> None:
    up = _arm("upstream", {1: _level("upstream", [1.0, 1.0])})
    ours = _arm("ours", {1: _level("ours", [0.5, 0.5])})
    up.fault = {
        "requests": 8, "got_audio": 0, "bad_error": "HTTP 500: EngineCore | died", "bad_got_audio": False,
        "survived": False, "recover_s": None,
    }  # fmt: skip
    ours.fault = {
        "requests": 8, "got_audio": 7, "bad_error": "HTTP 500: speech token 7000 at position 9",
        "bad_got_audio": False, "survived": True, "recover_s": 0.4,
    }  # fmt: skip
    report = EngineABReport(EngineABConfig(families=("step_audio2",), concurrency=(1,)), command="bench engine-ab")
    report.families["step_audio2"] = _family(up, ours)
    ab_report.write_json(report, tmp_path / "r.json")
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["schema"] == "vllm-omni/bench-engine-ab/1" and doc["benchmark"] == "engine_ab"
    fam = doc["families"]["step_audio2"]
    assert set(fam["arms"]) == {"upstream", "ours"} and fam["verdict"] == ab_report.verdict(
        report.families["step_audio2"]
    )
    assert fam["arms"]["upstream"]["overrides_env"] == "VLLM_OMNI_TOKEN2WAV_OVERRIDES=0"
    assert fam["arms"]["ours"]["levels"]["1"]["throughput_audio_s_per_s"] == pytest.approx(4.0)
    assert fam["comparison"]["levels"]["1"]["throughput_ours_over_upstream"] == pytest.approx(2.0)
    text = ab_report.render_text(report)
    assert "| upstream | 0/8 | HTTP 500: EngineCore / died | no | - |" in text
    assert "| ours | 7/8 | HTTP 500: speech token 7000 at position 9 | yes | 0.40 |" in text
    assert ab_report.plottable(report)
    ab_report.write_plot(report, tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_requests_are_the_same_for_both_arms_and_the_fault_wave_has_one_bad_code() -> None:
    assert request_codes(0, 4, 2, 50) == request_codes(0, 4, 2, 50) != request_codes(0, 4, 3, 50)
    assert all(0 <= c < 6561 for c in request_codes(1, 8, 0, 200))
    wave = fault_codes(0, 25)
    assert len(wave) == FAULT_REQUESTS
    bad = [(i, j) for i, codes in enumerate(wave) for j, c in enumerate(codes) if not 0 <= c < 6561]
    assert bad == [(FAULT_INDEX, BAD_POSITION)] and wave[FAULT_INDEX][BAD_POSITION] == BAD_CODE
    assert [level_order(i)[0] for i in range(3)] == ["upstream", "ours", "upstream"]


def test_first_error_line_finds_the_exception_and_the_frame_that_raised_it() -> None:
    log = "\n".join(
        [
            "\x1b[0;36m(APIServer pid=1)\x1b[0;0m WARNING 12-03 22:34:11 [base.py:370] ValueError: handled elsewhere",
            "(Worker pid=2) ERROR 12-03 22:34:13 [x.py:1] Traceback (most recent call last):",
            '(Worker pid=2) ERROR 12-03 22:34:13 [x.py:1]   File "/e/site-packages/s3tokenizer/utils.py", line 57, in '
            "_rename_weights",
            '(Worker pid=2) ERROR 12-03 22:34:13 [x.py:1]     assert "blocks" in k',
            "(Worker pid=2) ERROR 12-03 22:34:13 [x.py:1]            ^^^^^^^^^^^^^",
            "(Worker pid=2) ERROR 12-03 22:34:13 [x.py:1] AssertionError",
            "RuntimeError: Worker failed",
        ]
    )
    assert first_error_line(log) == 'AssertionError (s3tokenizer/utils.py:57 in _rename_weights: assert "blocks" in k)'
    assert first_error_line("RuntimeError: shape [1, 80] vs [1, 512]\nValueError: later") == (
        "RuntimeError: shape [1, 80] vs [1, 512]"
    )
    assert first_error_line("INFO all good\n") is None
    state_dict = (
        "(Worker pid=3) ERROR 12-03 22:56:18 [m.py:944] RuntimeError: Error(s) in loading state_dict for X:\n"
        "(Worker pid=3) ERROR 12-03 22:56:18 [m.py:944] \tsize mismatch for conv1.weight: [64, 80] vs [1024, 80]."
    )
    assert first_error_line(state_dict) == (
        "RuntimeError: Error(s) in loading state_dict for X: size mismatch for conv1.weight: [64, 80] vs [1024, 80]."
    )


def test_upstream_max_num_seqs_is_read_from_its_deploy_yaml_and_named(tmp_path: Path) -> None:
    (tmp_path / "step_audio_2.yaml").write_text(
        "stages:\n  - stage_id: 0\n    max_num_seqs: 3\n  - stage_id: 1\n    max_num_seqs: 1\n"
    )
    assert upstream_max_num_seqs("step_audio2", tmp_path) == (1, "vllm_omni/deploy/step_audio_2.yaml stage 1")
    from vllm_omni_token2wav.benchmarks.engine_ab.run import EngineABSetupError

    with pytest.raises(EngineABSetupError, match="cosyvoice3.yaml: cannot read"):
        upstream_max_num_seqs("cosyvoice3", tmp_path)
    overlay = yaml.safe_load(write_overlay(tmp_path, "up", "cosyvoice3", 8).read_text())
    assert overlay["stages"] == [{"stage_id": 0, "max_num_seqs": 8}]
    assert overlay["base_config"].endswith("deploy/cosyvoice3_code2wav.yaml")


def test_the_command_line_builds_its_choices_without_torch() -> None:
    """`bench engine-ab --help` reads the family list only: the CLI module imports neither torch nor the run."""
    import subprocess
    import sys

    probe = (
        "import sys, vllm_omni_token2wav.benchmarks.engine_ab.cli as cli\n"
        "assert cli.FAMILY_NAMES, cli.FAMILY_NAMES\n"
        "print('torch' in sys.modules, 'vllm_omni_token2wav.benchmarks.engine_ab.run' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "False"]
