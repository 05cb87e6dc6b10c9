# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav bench token2wav-serve --engine --smoke` as typed: one real server, its report's fields.

One `vllm-omni-token2wav serve` of the stand-in stream deployment starts (about 2 minutes on 2
cores), serves two 1.6 s replies at c = 1 and c = 2, and is stopped; the in-process run of the
same codes follows. The checks are about plumbing and honesty (every documented field, the
worker's counters matching what was served, the producer's rate logged per request, finite
numbers, the table and the PNG), not about speed.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from tests.helpers.bench_cli import run_bench_subprocess
from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the served token2wav-serve benchmark")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REPLY_S = 1.6  # the smoke plan: 40 codes per reply
CHUNKS_PER_REPLY = 2  # 40 codes: a 25 + 3 chunk, then the last 15


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("t2w_serve_engine")
    proc = run_bench_subprocess(out, "token2wav-serve", "--engine", "--smoke", timeout=900)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else None
    return {"proc": proc, "report": report, "png": out / "report.png"}


def _finite_percentiles(block: dict[str, Any]) -> bool:
    return set(block) == {"p50", "p90", "p99", "mean"} and all(math.isfinite(v) for v in block.values())


def test_the_served_smoke_run_prints_the_table_and_writes_json_and_plot(smoke: dict[str, Any]) -> None:
    proc = smoke["proc"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    for needle in ("engine batched", "in-proc batched", "in-proc 1/fwd", "engine/in-proc b", "x in-proc", "talker/s"):
        assert needle in proc.stdout, needle
    assert proc.stdout.startswith("token2wav served stack"), "vLLM's own log lines must not reach the table"
    assert smoke["png"].read_bytes().startswith(PNG_SIGNATURE)


def test_the_served_json_has_every_documented_field(smoke: dict[str, Any]) -> None:
    report = smoke["report"]
    assert report is not None, smoke["proc"].stderr[-3000:]
    assert report["schema"] == "vllm-omni/bench-token2wav-serve-engine/1" and report["complete"] is True
    assert "token2wav-serve --engine --smoke" in report["command"] and report["config"]["plan"] == "engine-smoke"
    env = report["environment"]
    assert env["loadavg_start"] is not None and env["loadavg_end"] is not None
    assert env["engine"]["vllm_omni"].startswith("vllm-omni 0.30")
    assert list(report["servers"]) == ["batched"]  # the smoke plan starts one server
    server = report["servers"]["batched"]
    assert server["code2wav_max_num_seqs"] == 2 and server["ready_after_s"] > 0 and server["torch_threads"] >= 1
    assert server["deploy_overlay"]["stages"][1] == {"stage_id": 1, "max_num_seqs": 2}
    assert "stage_1" in server["cpu_binding"]
    assert report["in_process"]["config"]["clock"] == "cpu"  # the default: in-process steps on a core of their own
    assert [level["concurrency"] for level in report["levels"]] == [1, 2]
    for level in report["levels"]:
        served = level["modes"]["batched"]
        assert set(level["modes"]) == {"batched"} and "ratio_batched_over_unbatched" not in level
        assert served["errors"] == 0 and served["requests"] == 2
        assert served["audio_s"] == pytest.approx(2 * REPLY_S) and served["throughput_audio_s_per_s"] > 0
        for key in ("ttfp_s", "rtf", "stall_s"):
            assert _finite_percentiles(served[key]), key
        assert all(r["audio_s"] == pytest.approx(REPLY_S) and r["ttfp_s"] > 0 for r in served["per_request"])
        engine = served["engine"]
        # the worker's own counters: every chunk of both replies was one row of some step
        assert engine["rows"] == 2 * CHUNKS_PER_REPLY and served["steps"] == engine["steps"] >= CHUNKS_PER_REPLY
        assert sum(v["steps"] for v in engine["steps_by_rows"].values()) == engine["steps"]
        assert engine["forward_ms_per_step"] > 0 and 0 < engine["busy"] <= 1.0 and engine["stage_errors"] == 0
        assert 0 < engine["forward_cpu_ms_per_step"] <= engine["forward_ms_per_step"] * 1.05  # CPU time <= wall
        versus = engine["vs_in_process"]
        assert 0 < versus["coverage"] + versus["estimated"] <= 1 and versus["ratio"] > 0 and versus["cpu_ratio"] > 0
        talker = served["talker"]
        assert talker["logged_requests"] == 2 and talker["codes_per_s"]["p50"] > 0
        inproc = level["in_process"]
        assert set(inproc["modes"]) == {"batched", "unbatched"}
        assert talker["codes_per_s"]["p50"] - 0.1 <= inproc["talker_rate"] <= talker["codes_per_s"]["p99"] + 0.1
        for mode in inproc["modes"].values():
            assert mode["errors"] == 0 and mode["requests"] == 2 and mode["audio_s"] == pytest.approx(2 * REPLY_S)
        assert level["engine_over_in_process"]["batched"]["throughput_audio_s_per_s"] > 0
