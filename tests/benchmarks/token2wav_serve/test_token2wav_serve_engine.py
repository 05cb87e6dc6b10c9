# SPDX-License-Identifier: Apache-2.0
"""The served benchmark's arithmetic and parsing, without an engine: stats deltas, the per-step comparison,
the log tables it reads the producer's rate from, the deploy overlay, and the client's byte accounting.

Expected values are worked out by hand from the inputs each test writes.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.local_http import local_http_server
from vllm_omni_token2wav.benchmarks import engine_log
from vllm_omni_token2wav.benchmarks.speech_stream_client import ServedRequest, run_closed_or_poisson, wav_rate
from vllm_omni_token2wav.benchmarks.token2wav_serve.engine import (
    EngineServeConfig,
    EngineSteps,
    engine_over_in_process,
    in_process_seconds,
    read_overlay,
    step_means,
    write_overlay,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

_API = "\x1b[0;36m(APIServer pid=326)\x1b[0;0m INFO 12-03 15:59:00 [stats.py:1009] "
_CORE = (
    "\x1b[0;36m(StageEngineCoreProc_stage{n}_replica0 pid=365)\x1b[0;0m \x1b[32mINFO\x1b[0m "
    "[ompmultiprocessing.py:185] \t"
)


def _table(rid: str, tpot_ms: str, tokens_in: str) -> str:
    rows = [
        f"[StageRequestStats [request_id={rid}]]\r",
        "+----------------+---------------+---------------+\r",
        "| Field          |             0 |             1 |\r",
        "+----------------+---------------+---------------+\r",
        "| audio_generated_frames |             0 |        96,000 |\r",
        f"| num_tokens_in  |  {tokens_in} |             0 |\r",
        "| num_tokens_out |           100 |             0 |\r",
        f"| inter_output_latencies_ms | {tpot_ms} (n=99) | 284.253 (n=3) |\r",
        f"| vllm_tpot_ms   |  {tpot_ms} |         0.000 |\r",
        "+----------------+---------------+---------------+",
    ]
    return "\n".join(_API + row for row in rows) + "\n"


def test_stage_tables_give_each_requests_producer_rate_and_prompt_length() -> None:
    text = (
        _table("speech-a-1", "12.5", "84")
        + _API
        + "[SpeechE2E] request_id=speech-a stream=true status=ok\n"
        + _table("speech-b-2", "20.000", "1,085")
    )
    tables = engine_log.stage_request_stats(text)
    assert [t["request_id"] for t in tables] == ["speech-a-1", "speech-b-2"]
    assert tables[0]["stages"][0]["num_tokens_in"] == 84 and tables[1]["stages"][0]["num_tokens_in"] == 1085
    assert tables[0]["stages"][1]["audio_generated_frames"] == 96000
    assert tables[0]["stages"][0]["inter_output_latencies_ms"] == 12.5  # "(n=99)" is not the value
    assert engine_log.talker_codes_per_s(tables) == [80.0, 50.0]  # 1000 / 12.5, 1000 / 20


def test_cpu_binding_is_read_per_stage() -> None:
    text = "".join(
        _CORE.format(n=n) + line + "\r\n"
        for n, line in (
            (0, "local_rank=0, core ids=[0]"),
            (0, "reserved_cpus=[1]"),
            (1, "local_rank=0, core ids=[2, 3]"),
        )
    )
    assert engine_log.cpu_binding(text) == {"stage_0": [0], "reserved": [1], "stage_1": [2, 3]}


def test_read_from_returns_the_new_text_and_the_next_offset(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"first\n")
    text, offset = engine_log.read_from(log, 0)
    with log.open("ab") as handle:
        handle.write(b"second\n")
    assert (text, offset) == ("first\n", 6)
    assert engine_log.read_from(log, offset) == ("second\n", 13)
    assert engine_log.read_from(tmp_path / "missing.log", 4) == ("", 4)


def _stats(by_rows: dict[str, tuple[int, float]], *, errors: int = 0, write_s: float = 0.0) -> dict[str, Any]:
    return {  # the thread's CPU time is half the wall time in these files
        "steps_by_rows": {k: {"steps": n, "seconds": s, "cpu_seconds": s / 2} for k, (n, s) in by_rows.items()},
        "errors": errors,
        "stats_write_s": write_s,
        "torch_threads": 1,
        "last_error": "boom" if errors else None,
    }


def test_engine_steps_are_the_difference_of_two_stats_files() -> None:
    before = _stats({"1": (10, 2.0), "2": (1, 0.5)}, write_s=0.1)
    after = _stats({"1": (13, 2.6), "2": (1, 0.5), "3": (2, 1.2)}, errors=1, write_s=0.25)
    steps = EngineSteps.between(before, after)
    assert steps.by_rows == {  # rows 2 did nothing new
        1: (3, pytest.approx(0.6), pytest.approx(0.3)),
        3: (2, pytest.approx(1.2), pytest.approx(0.6)),
    }
    assert (steps.steps, steps.rows) == (5, 3 * 1 + 2 * 3)
    assert steps.forward_s == pytest.approx(1.8) and steps.forward_cpu_s == pytest.approx(0.9)
    assert steps.stats_write_s == pytest.approx(0.15)
    assert (steps.errors, steps.last_error, steps.torch_threads) == (1, "boom", 1)
    assert EngineSteps.between(None, None).steps == 0
    assert EngineSteps.between(None, after).steps == 13 + 1 + 2  # no earlier file: everything counted


def test_engine_over_in_process_weights_in_process_steps_by_the_engines_step_mix() -> None:
    engine = EngineSteps(steps=6, by_rows={1: (4, 0.8, 0.4), 2: (1, 0.3, 0.2), 5: (1, 1.0, 0.6)})
    in_process = step_means([(1, 0.1), (1, 0.3), (2, 0.25), (3, 0.4)])
    assert in_process == {1: pytest.approx(0.2), 2: 0.25, 3: 0.4}
    out = engine_over_in_process(engine, in_process)
    # rows 5 was not measured in-process: 0.4 + 2 x (0.4 - 0.25) = 0.7 s by the rows 2-3 segment extended
    expected = 4 * 0.2 + 1 * 0.25 + 1 * 0.7
    assert out["coverage"] == pytest.approx(5 / 6) and out["estimated"] == pytest.approx(1 / 6)
    assert out["in_process_ms_per_step"] == pytest.approx(1e3 * expected / 6)
    assert out["ratio"] == pytest.approx((0.8 + 0.3 + 1.0) / expected)
    assert out["cpu_ratio"] == pytest.approx((0.4 + 0.2 + 0.6) / expected)
    assert engine_over_in_process(engine, {})["ratio"] is None


def test_in_process_steps_of_unmeasured_row_counts_are_linear_in_rows() -> None:
    means = {1: 0.1, 4: 0.4, 8: 0.6}
    assert in_process_seconds(means, 4) == 0.4  # measured
    assert in_process_seconds(means, 3) == pytest.approx(0.3)  # between 1 and 4
    assert in_process_seconds(means, 6) == pytest.approx(0.5)  # between 4 and 8
    assert in_process_seconds(means, 10) == pytest.approx(0.7)  # the 4-8 segment extended
    assert in_process_seconds({2: 0.2}, 3) is None  # one measured count: no slope


def test_the_overlay_inherits_the_shipped_deployment_and_sets_both_stages(tmp_path: Path) -> None:
    import yaml

    path = write_overlay(tmp_path, "unbatched", producer_seqs=8, code2wav_seqs=1, max_tokens=100)
    overlay = yaml.safe_load(path.read_text())
    base = Path(overlay["base_config"])
    assert base.is_absolute() and base.name == "standin_step_audio2_stream.yaml" and base.is_file()
    assert overlay["stages"] == [
        {"stage_id": 0, "max_num_seqs": 8, "default_sampling_params": {"max_tokens": 100}},
        {"stage_id": 1, "max_num_seqs": 1},
    ]
    assert read_overlay(path) == overlay  # what the report records
    soak = yaml.safe_load(write_overlay(tmp_path, "soak", max_tokens=50).read_text())  # slots as shipped
    assert soak["stages"] == [{"stage_id": 0, "default_sampling_params": {"max_tokens": 50}}]


def test_config_rules() -> None:
    cfg = EngineServeConfig()
    assert (cfg.tokens, cfg.batched_seqs, [cfg.requests_at(c) for c in cfg.concurrency]) == (100, 8, [4, 12, 24])
    with pytest.raises(ValueError, match="below the largest level 8"):
        EngineServeConfig(max_num_seqs=4).validate()


class _PcmHandler(BaseHTTPRequestHandler):
    """Streams 1,000 samples of PCM in three writes, or a JSON error for input 'bad'."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["input"] == "bad":
            payload = json.dumps({"error": {"message": "token2wav: speech token 7000 is out of range"}}).encode()
            self.send_response(500)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        assert body == {"input": body["input"], "response_format": "pcm", "stream": True, "stream_format": "audio"}
        self.send_response(200)
        self.send_header("Content-Type", "audio/pcm")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for size in (601, 799, 600):  # 2,000 bytes; the first write ends inside a sample
            self.wfile.write(f"{size:x}\r\n".encode() + b"\x01" * size + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: Any) -> None:
        pass


def test_the_client_counts_whole_samples_and_reports_http_errors() -> None:
    with local_http_server(_PcmHandler) as port:
        requests = [ServedRequest("ok-0", "hello"), ServedRequest("bad-1", "bad"), ServedRequest("ok-2", "again")]
        results = run_closed_or_poisson(port, requests, 2)
    ok, bad, again = results
    assert ok.samples == again.samples == 1000 and not ok.errors
    assert all(n > 0 for _, n in ok.deliveries) and ok.ttfp_s() is not None and ok.ttfp_s() >= 0
    assert bad.samples == 0 and bad.errors == ["HTTP 500: token2wav: speech token 7000 is out of range"]
    assert [r.request_id for r in results] == ["ok-0", "bad-1", "ok-2"]


def test_wav_rate_reads_the_streamed_header() -> None:
    import struct

    header = b"RIFF" + b"\xff" * 4 + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 24000, 48000, 2, 16)
    header += b"data" + b"\xff" * 4
    assert len(header) == 44 and wav_rate(header) == 24000
    with pytest.raises(Exception, match="not a WAV stream"):
        wav_rate(b"\x00" * 44)
