# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav bench token2wav-serve --engine --soak --smoke` as typed: one real server, a tiny soak.

One `vllm-omni-token2wav serve` of the stand-in stream deployment starts (about 2 minutes on 2 cores),
serves 32 streamed 1 s replies at c = 8 and a burst of 16 at c = 16 (above the stages' 8 slots: the
engine queues the rest), idles 10 s, and is stopped. The checks: zero failures and a PASS verdict,
every reply whole, the server tree's memory sampled in every phase with a finite slope, TTFP per
window, the table and the PNG. That a failure fails the verdict is `test_token2wav_serve_soak.py`'s
(synthetic reports, no engine).
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from tests.helpers.bench_cli import run_bench_subprocess
from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the served token2wav-serve soak")

SUSTAINED, BURST, WINDOW = 32, 16, 8  # the soak-smoke plan
REPLY_SAMPLES = 24000  # 1 s replies


@pytest.fixture(scope="module")
def soak(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("t2w_serve_soak")
    proc = run_bench_subprocess(out, "token2wav-serve", "--engine", "--soak", "--smoke", timeout=900)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else None
    return {"proc": proc, "report": report, "png": out / "report.png"}


def test_the_soak_passes_with_zero_failures_and_prints_its_table(soak: dict[str, Any]) -> None:
    proc = soak["proc"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert proc.stdout.startswith("token2wav served stack, soak and burst")
    for needle in ("verdict: PASS", "RSS slope", "MB per 100 requests", "burst 0-15", "TTFP p50"):
        assert needle in proc.stdout, needle
    assert soak["png"].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_the_soak_report_has_failures_memory_and_windows(soak: dict[str, Any]) -> None:
    report = soak["report"]
    assert report is not None, soak["proc"].stderr[-3000:]
    assert report["schema"] == "vllm-omni/bench-token2wav-serve-soak/1" and report["complete"] is True
    assert report["config"]["plan"] == "soak-smoke" and "--soak --smoke" in report["command"]
    assert report["verdict"] == {"passed": True, "failures": 0, "unfinished": 0, "reasons": []}
    assert report["stage_errors"] == 0
    # every planned request was sent and came back whole
    per_request = report["per_request"]
    assert [r["phase"] for r in per_request] == ["sustained"] * SUSTAINED + ["burst"] * BURST
    assert all(r["failure"] is None and r["samples"] == REPLY_SAMPLES and r["ttfp_s"] > 0 for r in per_request)
    # the stage itself saw every stream end (warm-up: 3 requests)
    assert report["server"]["stage_streams_finished"] == SUSTAINED + BURST + 3
    assert report["server"]["max_num_seqs"] == {"stage_0": 8, "stage_1": 8}  # the shipped deploy's
    assert report["phases"]["burst"]["concurrency"] == 16 and report["phases"]["sustained"]["concurrency"] == 8
    # windows: 4 of 8 sustained requests, then the burst; TTFP percentiles finite, p50 <= p99
    windows = report["windows"]
    assert [(w["phase"], w["finished"]) for w in windows] == [("sustained", WINDOW)] * 4 + [("burst", BURST)]
    for w in windows:
        assert w["failures"] == 0 and w["throughput_audio_s_per_s"] > 0
        assert 0 < w["ttfp_s"]["p50"] <= w["ttfp_s"]["p99"] and math.isfinite(w["ttfp_s"]["p99"])
        assert w["rss_mb_end"] > 100  # the engine's processes hold torch and vLLM
    # memory: the server tree (API server, engine cores, workers), sampled in every phase
    samples = report["memory_samples"]
    assert {s["phase"] for s in samples} >= {"sustained", "burst", "settle"}
    assert all(s["processes"] >= 3 and s["rss_mb"] > 100 for s in samples)
    after = report["server"]["processes_after_settle"]
    assert len(after) == samples[-1]["processes"] and sum(p["rss_mb"] for p in after) > 100
    assert [s["t_s"] for s in samples] == sorted(s["t_s"] for s in samples)
    mem = report["memory"]
    assert mem["slope"]["samples"] >= 2 and math.isfinite(mem["slope"]["mb_per_min"])
    assert math.isfinite(mem["slope"]["mb_per_100_requests"])
    assert mem["sustained"]["peak_mb"] < 5000  # the brief's budget for one stand-in server
