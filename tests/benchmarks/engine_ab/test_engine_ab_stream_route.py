# SPDX-License-Identifier: Apache-2.0
"""`bench engine-ab --route stream` without an engine: its deploy overlays, its requests and how replies count.

The stream route serves the stand-in producer in front of the code2wav stage, so both arms' overlays must set
the producer's sequences and reply length and only the code2wav stage's `max_num_seqs` may differ; a request's
text must give both arms the same codes; a reply of the wrong length is a failed request, not audio.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.local_http import local_http_server
from vllm_omni_token2wav.benchmarks.engine_ab.run import (
    PRODUCER_SEQS,
    SAMPLES_PER_TOKEN,
    STREAM_FAMILIES,
    EngineABConfig,
    code2wav_stage_id,
    our_deploy,
    our_max_num_seqs,
    request_text,
    stream_wave,
    write_overlay,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

TOKENS = 5


def test_stream_families_are_the_plugins_stand_in_stream_pipelines() -> None:
    pytest.importorskip("yaml")
    from vllm_omni_token2wav.plugins.pipelines import STANDIN_STREAM_FAMILIES

    assert STREAM_FAMILIES == STANDIN_STREAM_FAMILIES


def test_overlays_keep_the_producer_equal_and_set_the_reply_length(tmp_path: Path) -> None:
    assert (code2wav_stage_id("alone"), code2wav_stage_id("stream")) == (0, 1)
    assert our_deploy("step_audio2", "stream").name == "standin_step_audio2_stream.yaml"
    assert our_max_num_seqs("step_audio2", "stream") == 8
    up = yaml.safe_load(write_overlay(tmp_path, "up", "step_audio2", 1, "stream", 100).read_text())
    ours = yaml.safe_load(write_overlay(tmp_path, "ours", "step_audio2", 8, "stream", 100).read_text())
    producer = {"stage_id": 0, "max_num_seqs": PRODUCER_SEQS, "default_sampling_params": {"max_tokens": 100}}
    assert up["stages"] == [producer, {"stage_id": 1, "max_num_seqs": 1}]
    assert ours["stages"] == [producer, {"stage_id": 1, "max_num_seqs": 8}]
    assert up["base_config"] == ours["base_config"] == str(our_deploy("step_audio2", "stream"))
    with pytest.raises(ValueError, match="needs the reply length"):
        write_overlay(tmp_path, "x", "step_audio2", 1, "stream")


def test_the_config_refuses_what_the_stream_route_cannot_serve() -> None:
    EngineABConfig(families=("step_audio2", "cosyvoice3"), route="stream", faults=False).validate()
    with pytest.raises(ValueError, match="minicpmo_4_5 has no stand-in stream deployment"):
        EngineABConfig(families=("minicpmo_4_5",), route="stream", faults=False).validate()
    with pytest.raises(ValueError, match="fault wave needs route alone"):
        EngineABConfig(families=("step_audio2",), route="stream", faults=True).validate()
    with pytest.raises(ValueError, match="route must be one of alone, stream"):
        EngineABConfig(route="duplex").validate()


def test_request_texts_are_per_level_and_index() -> None:
    assert request_text(0, 4, 2) == request_text(0, 4, 2) != request_text(0, 4, 3) != request_text(1, 4, 3)


class _Handler(BaseHTTPRequestHandler):
    """The right reply length for any text but 'short', which ends one sample early."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        samples = TOKENS * SAMPLES_PER_TOKEN - (1 if body["input"] == "short" else 0)
        self.send_response(200)
        self.send_header("Content-Type", "audio/pcm")
        self.send_header("Content-Length", str(2 * samples))
        self.end_headers()
        self.wfile.write(b"\x00\x01" * samples)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def port() -> Iterator[int]:
    with local_http_server(_Handler) as bound:
        yield bound


def test_a_reply_of_the_wrong_length_is_a_failed_request(port: int) -> None:
    ok, short = stream_wave(port, ["fine", "short"], 2, prefix="t", tokens=TOKENS, timeout_s=10)
    assert (ok.request_id, ok.errors, ok.samples, ok.tokens) == ("t-0", [], TOKENS * SAMPLES_PER_TOKEN, TOKENS)
    assert short.errors == [f"reply of {TOKENS * SAMPLES_PER_TOKEN - 1} samples, expected 4800 ({TOKENS} codes)"]


# A stand-in for `vllm-omni-token2wav serve`: a process of its own (its own process group, as the real one),
# `/health`, and `/v1/audio/speech` streaming the overlay's reply length in 25-code chunks, 20 ms apart.
_FAKE_SERVER = """
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

port, deploy = int(sys.argv[1]), yaml.safe_load(open(sys.argv[2]))
tokens = deploy["stages"][0]["default_sampling_params"]["max_tokens"]

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path == "/v1/audio/speech" and body["stream"] is True, (self.path, body)
        self.send_response(200)
        self.send_header("Content-Type", "audio/pcm")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        left = tokens
        while left:
            n = min(25, left)
            left -= n
            data = b"\\x00\\x01" * (n * 960)
            self.wfile.write(f"{len(data):x}\\r\\n".encode() + data + b"\\r\\n")
            self.wfile.flush()
            time.sleep(0.02)
        self.wfile.write(b"0\\r\\n\\r\\n")

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def test_the_benchmark_streams_both_arms_from_their_overlays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    from vllm_omni_token2wav.benchmarks.engine_ab import run
    from vllm_omni_token2wav.benchmarks.engine_server import EngineServer, free_port
    from vllm_omni_token2wav.model_executor.models.standin import model_dirs

    script = tmp_path / "fake_server.py"
    script.write_text(_FAKE_SERVER)
    launched: list[tuple[Path, dict[str, str]]] = []

    class FakeServer(EngineServer):
        def launch(self) -> EngineServer:
            self.port = self.port or free_port()
            launched.append((self.deploy, dict(self.env)))
            with self.log_path.open("wb") as log:
                command = [sys.executable, str(script), str(self.port), str(self.deploy)]
                self._proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            return self

    monkeypatch.setattr(run, "EngineServer", FakeServer)
    monkeypatch.setattr(run, "upstream_max_num_seqs", lambda family: (1, "vllm_omni/deploy/step_audio_2.yaml stage 1"))
    monkeypatch.setattr(model_dirs, "ensure_engine_model_dir", lambda family, upstream_compatible: tmp_path)
    config = EngineABConfig(
        families=("step_audio2",), route="stream", concurrency=(1, 2), audio_seconds=2.0, faults=False,
        server_logs=tmp_path / "logs", startup_timeout_s=60, request_timeout_s=30,
    )  # fmt: skip
    report = run.EngineABBenchmark(config).run()

    overlays = {env[run.OVERRIDES_ENV]: yaml.safe_load(deploy.read_text()) for deploy, env in launched}
    assert sorted(overlays) == ["0", "1"]
    assert [s["max_num_seqs"] for s in overlays["0"]["stages"]] == [PRODUCER_SEQS, 1]
    assert [s["max_num_seqs"] for s in overlays["1"]["stages"]] == [PRODUCER_SEQS, 8]
    document = report.to_dict()
    assert document["config"]["route"] == "stream" and document["config"]["endpoint"] == "/v1/audio/speech"
    family = report.families["step_audio2"]
    for name, arm in family.arms.items():
        assert arm.status == "ok" and arm.fault is None, (name, arm.to_dict())
        assert sorted(arm.levels) == [1, 2]
        level = arm.levels[2].to_dict()
        assert level["requests"] == 2 and level["failed"] == 0
        assert level["audio_s"] == pytest.approx(2 * 2.0)
        first = arm.levels[2].run.requests[0]
        assert len(first.deliveries) >= 2  # streamed: two 25-code chunks, not one reply
        assert first.ttfp_s() < first.deliveries[-1][0] - first.arrival_s
    assert family.order == {1: ["upstream", "ours"], 2: ["ours", "upstream"]}
