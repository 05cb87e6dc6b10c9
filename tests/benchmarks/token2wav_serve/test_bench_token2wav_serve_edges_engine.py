# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav bench token2wav-serve --engine --edge shm,mooncake --smoke` as typed: both edges, served.

Two `vllm-omni-token2wav serve` runs of the stand-in stream deployment, one after the other (about 2 minutes
each on 2 cores): the code2wav edge on SharedMemory, then on Mooncake's transfer engine over TCP on 127.0.0.1
(the `multinode` extra; the plugin's Mooncake patches). Each serves 2 streamed 1.2 s replies (30 codes: chunks of
25 and 5) at c = 1. The checks: every reply whole, every chunk timed once on each side of the edge by the
connector the edge names and in two different processes (so it crossed the edge), the table with its target line,
the JSON and the PNG. The arithmetic of the transfer times and targets is `test_token2wav_serve_edges.py`'s.

Needs `mooncake-transfer-engine-non-cuda` and its system libraries (`tools/dev_setup.sh` installs both; in CI the
module fails instead of skipping when they are missing).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers.bench_cli import run_bench_subprocess
from tests.helpers.engine import require_engine, require_mooncake

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the served token2wav-serve edge comparison")
require_mooncake("the edge comparison")

REPLY_SAMPLES = 30 * 960  # the edges-smoke plan: 1.2 s replies
CHUNKS = 2 * 2  # 2 requests, 30 codes in chunks of 25 + 5
CONNECTORS = {"shm": "SharedMemoryConnector", "mooncake": "MooncakeTransferEngineConnector"}


@pytest.fixture(scope="module")
def edges(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("t2w_serve_edges")
    proc = run_bench_subprocess(
        out, "token2wav-serve", "--engine", "--edge", "shm,mooncake", "--smoke", "--server-logs", str(out / "logs"),
        timeout=1200,
    )  # fmt: skip
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else None
    return {"proc": proc, "report": report, "png": out / "report.png"}


def test_both_edges_serve_whole_replies_and_the_table_says_the_targets(edges: dict[str, Any]) -> None:
    proc = edges["proc"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert proc.stdout.startswith("token2wav-serve --engine --edge: the code2wav edge")
    for needle in ("SharedMemory", "Mooncake TE (tcp)", "targets at c=1 (issue 35)", "TTFP p50 Mooncake"):
        assert needle in proc.stdout, needle
    assert edges["png"].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_every_chunk_crossed_the_edge_it_names_and_was_timed(edges: dict[str, Any]) -> None:
    report = edges["report"]
    assert report is not None, edges["proc"].stderr[-3000:]
    assert report["schema"] == "vllm-omni/bench-token2wav-serve-edges/1" and report["complete"] is True
    assert report["config"]["plan"] == "edges-smoke" and "--edge shm,mooncake --smoke" in report["command"]
    assert [(lv["edge"], lv["concurrency"]) for lv in report["levels"]] == [("shm", 1), ("mooncake", 1)]
    for level in report["levels"]:
        assert level["failures"] == [] and level["requests"] == 2
        assert level["audio_s"] == pytest.approx(2 * REPLY_SAMPLES / 24000)
        assert 0 < level["ttfp_s"]["p50"] <= level["ttfp_s"]["p99"] and level["throughput_audio_s_per_s"] > 0
        t = level["transfers"]
        assert t["connectors"] == [CONNECTORS[level["edge"]]], t
        assert t["chunks"] == t["puts"] == t["gets"] == t["cross_process"] == CHUNKS, t
        for key in ("put_ms", "get_ms", "transfer_ms", "handoff_ms"):
            assert 0 < t[key]["p50"] <= t[key]["p99"], (key, t)
    targets = report["targets"]
    assert targets["concurrency"] == 1 and targets["ttfp_p50_ratio"] > 0
