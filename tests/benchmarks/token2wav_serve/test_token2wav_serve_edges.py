# SPDX-License-Identifier: Apache-2.0
"""`bench token2wav-serve --engine --edge` without an engine: the transfer arithmetic, the timing site, the verdict,
the report and the CLI's refusals.

Transfer lines and request results are written by hand with known times, so every expected percentile, hand-off and
ratio is worked out from the inputs; the timing site (`token2wav_serve/transfer_site/sitecustomize.py`) is run in a
child Python against a stand-in connector module of the same dotted name, so its wrapping is what an engine process
gets.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_omni_token2wav.benchmarks.token2wav_serve import edges_report
from vllm_omni_token2wav.benchmarks.token2wav_serve.cli import SUBCOMMAND, build_edge_config, stem_for
from vllm_omni_token2wav.benchmarks.token2wav_serve.edges import (
    CONNECTOR_NAME,
    SITE,
    TRANSFERS_ENV,
    EdgeConfig,
    EdgeLevel,
    EdgeReport,
    edge_overlay,
    read_transfers,
    transfer_summary,
    tree_cpu_s,
)
from vllm_omni_token2wav.benchmarks.token2wav_serve.run import RequestResult
from vllm_omni_token2wav.cli_types import CLIUsageError

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

SAMPLES = 48000  # 2 s replies


def _line(op: str, key: str, ms: float, start: float, pid: int, connector: str = "C") -> dict[str, object]:
    return {"op": op, "key": key, "ok": True, "ms": ms, "start": start, "end": start + ms / 1e3, "bytes": 100,
            "connector": connector, "pid": pid}  # fmt: skip


def test_transfer_summary_pairs_puts_and_gets_by_key() -> None:
    lines = [
        _line("put", "a", 1.0, 10.000, 1),
        _line("get", "a", 2.0, 10.004, 2),  # hand-off: 10.000 -> 10.006 = 6 ms
        _line("put", "b", 3.0, 11.000, 1),
        _line("get", "b", 4.0, 11.010, 1),  # same process: counted, not cross-process
        _line("put", "c", 9.0, 12.000, 1),  # never got: not a chunk
        _line("miss", "c", 0.5, 12.001, 2),
        _line("miss", "c", 1.5, 12.011, 2),
    ]
    s = transfer_summary(lines)
    assert (s["chunks"], s["puts"], s["gets"], s["cross_process"]) == (2, 3, 2, 1)
    assert s["put_ms"]["p50"] == 1.0 and s["put_ms"]["p99"] == 3.0
    assert s["get_ms"]["p50"] == 2.0 and s["transfer_ms"]["p50"] == 3.0 and s["transfer_ms"]["p99"] == 7.0
    assert s["handoff_ms"]["p50"] == pytest.approx(6.0) and s["handoff_ms"]["p99"] == pytest.approx(14.0)
    assert s["connectors"] == ["C"] and s["bytes_per_chunk_mean"] == 100
    assert s["misses"] == 2 and s["miss_ms_total"] == 2.0 and s["miss_ms"]["p50"] == 0.5
    assert transfer_summary([])["chunks"] == 0 and transfer_summary([])["transfer_ms"]["p50"] is None


def test_the_site_times_put_and_every_get_that_returned_data(tmp_path: Path) -> None:
    # a stand-in connector module under the dotted name the site watches, imported after start-up
    pkg = tmp_path / "pkgs" / "vllm_omni" / "distributed" / "omni_connectors" / "connectors"
    pkg.mkdir(parents=True)
    for d in (pkg, *pkg.parents):
        if d == tmp_path / "pkgs":
            break
        (d / "__init__.py").write_text("")
    (pkg / "shm_connector.py").write_text(
        "class SharedMemoryConnector:\n"
        "    def put(self, from_stage, to_stage, put_key, data):\n        return True, len(data), None\n"
        "    def get(self, from_stage, to_stage, get_key, metadata=None):\n"
        "        return None if get_key == 'miss' else (b'x', 7)\n"
    )
    records = tmp_path / "records"
    records.mkdir()
    script = (
        "from vllm_omni.distributed.omni_connectors.connectors.shm_connector import SharedMemoryConnector as C\n"
        "c = C(); c.put('0', '1', 'k0', b'abc'); c.get('0', '1', 'miss'); c.get('0', '1', get_key='k0')\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SITE), str(tmp_path / "pkgs")]),
        TRANSFERS_ENV: str(records),
    }
    subprocess.run([sys.executable, "-c", script], check=True, env=env, cwd=tmp_path)
    lines = read_transfers(records)
    assert [(r["op"], r["key"], r["bytes"], r["connector"]) for r in lines] == [
        ("put", "k0", 3, "SharedMemoryConnector"),
        ("miss", "miss", None, "SharedMemoryConnector"),
        ("get", "k0", 7, "SharedMemoryConnector"),
    ]
    assert all(r["ms"] >= 0 and r["end"] >= r["start"] for r in lines)
    # without the variable the site does nothing
    env.pop(TRANSFERS_ENV)
    subprocess.run([sys.executable, "-c", script], check=True, env=env, cwd=tmp_path)
    assert len(read_transfers(records)) == 3


def test_the_mooncake_overlay_names_the_connector_on_both_ends_of_the_edge(tmp_path: Path) -> None:
    import yaml

    doc = yaml.safe_load(edge_overlay(tmp_path, "mooncake", 50).read_text())
    stages = {s["stage_id"]: s for s in doc["stages"]}
    assert stages[0]["output_connectors"] == {"to_stage_1": CONNECTOR_NAME}
    assert stages[1]["input_connectors"] == {"from_stage_0": CONNECTOR_NAME}
    assert stages[0]["default_sampling_params"] == {"max_tokens": 50}
    extra = doc["connectors"][CONNECTOR_NAME]["extra"]
    assert doc["connectors"][CONNECTOR_NAME]["name"] == "MooncakeTransferEngineConnector"
    assert (extra["protocol"], extra["host"]) == ("tcp", "127.0.0.1") and extra["zmq_port"] > 0
    shm = yaml.safe_load(edge_overlay(tmp_path, "shm", 50).read_text())
    assert "connectors" not in shm and [s["stage_id"] for s in shm["stages"]] == [0]


def _level(edge: str, c: int, ttfp: list[float], transfer_ms: float) -> EdgeLevel:
    results = []
    for i, t in enumerate(ttfp):
        r = RequestResult(f"{edge}{i}", 0, 50, 0.0, 0.0)
        r.deliveries = [(t, SAMPLES // 2), (t + 0.5, SAMPLES // 2)]
        results.append(r)
    lines = [_line("put", "k", transfer_ms / 2, 1.0, 1), _line("get", "k", transfer_ms / 2, 1.0, 2)]
    return EdgeLevel(edge, c, 2.0, SAMPLES, results, transfer_summary(lines))


def test_targets_compare_mooncake_with_shared_memory_at_the_largest_level() -> None:
    report = EdgeReport(EdgeConfig(concurrency=(1, 8)))
    report.levels = [
        _level("shm", 1, [0.1, 0.1], 1.0),
        _level("mooncake", 1, [0.1, 0.1], 1.0),
        _level("shm", 8, [0.2, 0.2, 0.3], 2.0),
        _level("mooncake", 8, [0.25, 0.25, 0.4], 6.0),
    ]
    report.complete = True
    t = report.targets()
    assert t is not None and t["concurrency"] == 8
    assert t["transfer_p50_ms"] == 6.0 and t["transfer_met"] is False
    assert t["ttfp_p50_ratio"] == pytest.approx(1.25) and t["ttfp_met"] is False
    s = report.levels[2].summary()
    assert s["throughput_audio_s_per_s"] == pytest.approx(3 * 2.0 / 2.0) and s["failures"] == []
    assert not report.failed()
    text = edges_report.render_text(report)
    assert "Mooncake transfer p50 6.00 ms <= 5 ms: NOT met" in text and "1.250 <= 1.15: NOT met" in text
    assert "SharedMemory" in text and "Mooncake TE (tcp)" in text
    head, rule, *rows = edges_report.table_lines(report)
    assert "misses" in head and "cpu s/audio s" in head and set(rule) == {"-"} and len(rows) == 4
    assert {len(row[18:].split()) for row in rows} == {
        13
    }  # c, req, fail, TTFP, audio s/s, chunks, 4 times, misses x2, cpu


def test_a_short_reply_or_an_error_is_a_failure(tmp_path: Path) -> None:
    level = _level("mooncake", 1, [0.1, 0.1], 1.0)
    level.results[0].deliveries.pop()
    level.results[1].errors.append("HTTP 500")
    report = EdgeReport(EdgeConfig(concurrency=(1,)), levels=[level], complete=True)
    assert report.failed() and len(level.failures()) == 2
    edges_report.write_json(report, tmp_path / "r.json")
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["schema"] == "vllm-omni/bench-token2wav-serve-edges/1" and doc["targets"] is None
    assert len(doc["levels"][0]["failures"]) == 2
    edges_report.write_plot(report, tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes().startswith(b"\x89PNG")


def test_tree_cpu_counts_a_child_that_burns_cpu() -> None:
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", burn])
    try:
        deadline = time.monotonic() + 20
        while (tree_cpu_s(child.pid) or 0.0) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert 0.3 <= (tree_cpu_s(child.pid) or 0.0) < 5.0
        assert (tree_cpu_s(os.getpid()) or 0.0) >= (tree_cpu_s(child.pid) or 0.0)  # the parent's tree holds it
    finally:
        child.kill()
        child.wait()
    assert tree_cpu_s(None) is None


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    SUBCOMMAND.add_cli_args(parser)
    return parser.parse_args(list(argv))


def test_cli_plans_refusals_and_stem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("vllm_omni_token2wav.benchmarks.token2wav_serve.engine.missing_engine", lambda: None)
    monkeypatch.setattr("vllm_omni_token2wav.benchmarks.token2wav_serve.edges.missing_mooncake", lambda: None)
    config = build_edge_config(_args("--engine", "--edge", "shm,mooncake"))
    assert config == EdgeConfig() and config.requests_at(8) == 16 and config.requests_at(1) == 4
    smoke = build_edge_config(_args("--engine", "--edge", "mooncake,shm", "--smoke"))
    assert (smoke.edges, smoke.concurrency, smoke.requests, smoke.plan) == (("mooncake", "shm"), (1,), 2, "edges-smoke")
    for argv, needle in (
        (("--edge", "shm"), "add --engine"),
        (("--engine", "--edge", "shm,nixl"), "expected distinct names of shm, mooncake"),
        (("--engine", "--edge", "shm,shm"), "expected distinct names"),
        (("--engine", "--edge", "shm", "--max-num-seqs", "2"), "--max-num-seqs does not apply to --engine --edge"),
        (("--engine", "--edge", "shm", "--audio-seconds", "1-2"), "one length"),
        (("--engine", "--edge", "shm", "--threads", "2"), "--threads does not apply"),
    ):
        with pytest.raises(CLIUsageError, match=needle):
            build_edge_config(_args(*argv))
    with pytest.raises(CLIUsageError, match="cannot be combined with --soak"):
        SUBCOMMAND.run(_args("--engine", "--soak", "--edge", "shm"))
    monkeypatch.setattr(
        "vllm_omni_token2wav.benchmarks.token2wav_serve.edges.missing_mooncake", lambda: "mooncake (the extra)"
    )
    with pytest.raises(CLIUsageError, match="--edge mooncake needs mooncake"):
        build_edge_config(_args("--engine", "--edge", "shm,mooncake"))
    assert build_edge_config(_args("--engine", "--edge", "shm")).edges == ("shm",)
    assert stem_for(["--engine", "--edge", "shm,mooncake"]) == "token2wav_serve_edges"
    assert stem_for(["--smoke"]) == "token2wav_serve"
