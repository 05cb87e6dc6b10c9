# SPDX-License-Identifier: Apache-2.0
"""`bench engine-ab --route pipeline` without an engine: one deployment for both arms, the requests, the replies.

The pipeline route serves upstream's own toy pipeline (`standin/toy/`) in both arms: both servers must get the
same overlay file (upstream's YAML with the reply length pinned) and differ only in the overrides switch; a
Step-Audio2 request streams raw PCM from the speech endpoint, a MiniCPM-o request streams a chat completion
whose audio deltas are base64 WAVs; a reply without audio is a failed request.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import wave
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.engine import require_engine
from tests.helpers.local_http import local_http_server
from vllm_omni_token2wav.benchmarks.engine_ab import pipeline
from vllm_omni_token2wav.benchmarks.engine_ab.pipeline import (
    PIPELINE_FAMILIES,
    TEXT_TOKENS,
    pipeline_wave,
    reply_overrides,
    wav_samples,
)
from vllm_omni_token2wav.benchmarks.engine_ab.run import EngineABConfig

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

TOKENS = 5


def _wav(samples: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes(b"\x00\x01" * samples)
    return buf.getvalue()


def test_reply_overrides_pin_the_producing_stages_lengths() -> None:
    (sa2,) = reply_overrides("step_audio2", 40).values()
    params = sa2["default_sampling_params"]
    assert params["max_tokens"] == 40
    assert params["allowed_token_ids"][0] == 151696 and len(params["allowed_token_ids"]) == 6561
    mo = reply_overrides("minicpmo_4_5", 40)
    assert mo[0]["default_sampling_params"] == {"max_tokens": TEXT_TOKENS, "min_tokens": TEXT_TOKENS}
    assert mo[1]["default_sampling_params"] == {"max_tokens": 41, "min_tokens": 41}
    assert reply_overrides("minicpmo_4_5", 100)[1]["default_sampling_params"] == {"max_tokens": 101, "min_tokens": 50}
    with pytest.raises(ValueError, match="no toy upstream pipeline route for 'cosyvoice3'"):
        reply_overrides("cosyvoice3", 40)


def test_the_config_refuses_what_the_pipeline_route_cannot_serve() -> None:
    EngineABConfig(families=PIPELINE_FAMILIES, route="pipeline", faults=False).validate()
    with pytest.raises(ValueError, match="cosyvoice3 has no toy upstream pipeline"):
        EngineABConfig(families=("cosyvoice3",), route="pipeline", faults=False).validate()
    with pytest.raises(ValueError, match="fault wave needs route alone"):
        EngineABConfig(families=("step_audio2",), route="pipeline", faults=True).validate()


def test_the_pipeline_deployment_is_upstreams_yaml_with_the_reply_length(tmp_path: Path) -> None:
    require_engine("the toy pipeline's deployment (upstream's deploy YAMLs)")
    from vllm_omni.config.stage_config import resolve_deploy_yaml

    deploy = pipeline.pipeline_deploy("minicpmo_4_5", tmp_path, tmp_path, 40)
    assert "minicpmo_4_5_turn.yaml" in deploy.read_text()
    stages = {s["stage_id"]: s for s in resolve_deploy_yaml(deploy)["stages"]}
    assert stages[1]["default_sampling_params"]["max_tokens"] == 41
    assert stages[1]["default_sampling_params"]["top_k"] == 25  # upstream's default kept
    assert pipeline.pipeline_max_num_seqs("minicpmo_4_5") == (
        4,
        "vllm_omni/deploy/minicpmo_4_5_turn.yaml stage 2 (both arms)",
    )
    assert pipeline.pipeline_max_num_seqs("step_audio2")[0] == 1


def test_wav_samples_reads_the_data_chunk() -> None:
    assert wav_samples(_wav(123)) == 123
    assert wav_samples(b"not a wav" * 10) is None


class _Handler(BaseHTTPRequestHandler):
    """Chat: a text delta, then two base64 WAV deltas (none for 'mute'); speech: raw PCM."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/audio/speech":
            data = b"\x00\x01" * (TOKENS * 960)
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        assert self.path == "/v1/chat/completions" and body["modalities"] == ["text", "audio"], body
        text = body["messages"][0]["content"]
        events = [{"choices": [{"delta": {"content": "hello"}}]}]
        if text != "mute":
            for n in (960, 1920):
                events.append({"choices": [{"delta": {"content": base64.b64encode(_wav(n)).decode()}}]})
        out = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def port() -> Iterator[int]:
    with local_http_server(_Handler) as bound:
        yield bound


def test_chat_audio_deltas_are_deliveries_and_a_reply_without_audio_fails(port: int) -> None:
    ok, mute = pipeline_wave(port, "minicpmo_4_5", "m", ["hi", "mute"], 2, prefix="t", tokens=TOKENS, timeout_s=10)
    assert ok.errors == [] and [n for _, n in ok.deliveries] == [960, 1920] and ok.tokens == TOKENS
    assert mute.errors == ["the reply carried no audio"] and mute.samples == 0


def test_speech_replies_are_streamed_pcm(port: int) -> None:
    (one,) = pipeline_wave(port, "step_audio2", "m", ["hi"], 1, prefix="s", tokens=TOKENS, timeout_s=10)
    assert one.errors == [] and one.samples == TOKENS * 960


# A stand-in for `vllm-omni-token2wav serve` of either family: `/health`, the speech endpoint (raw PCM) and
# the chat endpoint (SSE with base64 WAV deltas), each reply 2 chunks 20 ms apart.
_FAKE_SERVER = """
import base64, io, json, sys, time, wave
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port = int(sys.argv[1])

def wav(n):
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1); w.setsampwidth(2); w.setframerate(24000); w.writeframes(b"\\x00\\x01" * n)
    return buf.getvalue()

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        chat = self.path == "/v1/chat/completions"
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for _ in range(2):
            if chat:
                event = {"choices": [{"delta": {"content": base64.b64encode(wav(24000)).decode()}}]}
                data = f"data: {json.dumps(event)}\\n\\n".encode()
            else:
                data = b"\\x00\\x01" * 24000
            self.wfile.write(f"{len(data):x}\\r\\n".encode() + data + b"\\r\\n")
            self.wfile.flush()
            time.sleep(0.02)
        if chat:
            data = b"data: [DONE]\\n\\n"
            self.wfile.write(f"{len(data):x}\\r\\n".encode() + data + b"\\r\\n")
        self.wfile.write(b"0\\r\\n\\r\\n")

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def test_both_arms_serve_the_same_deployment_and_differ_only_in_the_switch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_engine("the toy pipeline's deployment (upstream's deploy YAMLs)")
    from vllm_omni_token2wav.benchmarks.engine_ab import run
    from vllm_omni_token2wav.benchmarks.engine_server import EngineServer, free_port
    from vllm_omni_token2wav.model_executor.models.standin.toy import TOY_PIPELINES

    script = tmp_path / "fake_server.py"
    script.write_text(_FAKE_SERVER)
    launched: list[tuple[str, Path, dict[str, str]]] = []

    class FakeServer(EngineServer):
        def launch(self) -> EngineServer:
            self.port = self.port or free_port()
            launched.append((str(self.model), self.deploy, dict(self.env)))
            with self.log_path.open("wb") as log:
                command = [sys.executable, str(script), str(self.port)]
                self._proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            return self

    monkeypatch.setattr(run, "EngineServer", FakeServer)
    for family in PIPELINE_FAMILIES:  # no toy folder needed: the fake server reads none
        monkeypatch.setattr(type(TOY_PIPELINES[family]), "ensure_model_dir", lambda self, root=None: tmp_path)
    config = EngineABConfig(
        families=PIPELINE_FAMILIES, route="pipeline", concurrency=(1, 2), audio_seconds=2.0, faults=False,
        server_logs=tmp_path / "logs", startup_timeout_s=60, request_timeout_s=30,
    )  # fmt: skip
    report = run.EngineABBenchmark(config).run()

    assert len(launched) == 4
    for family in PIPELINE_FAMILIES:
        arms = [(deploy, env) for model, deploy, env in launched if f"/{family}/" in str(deploy)]
        assert [env[run.OVERRIDES_ENV] for _, env in arms] == ["0", "1"]
        assert arms[0][0] == arms[1][0]  # one overlay file for both arms
        assert "UPSTREAM_PATH" not in arms[1][1] and str(run.UPSTREAM_PATH) in arms[0][1]["PYTHONPATH"]
    document = report.to_dict()
    assert document["config"]["route"] == "pipeline"
    assert document["config"]["endpoint"] == "step_audio2: /v1/audio/speech, minicpmo_4_5: /v1/chat/completions"
    for family in PIPELINE_FAMILIES:
        fam = report.families[family]
        for name, arm in fam.arms.items():
            assert arm.status == "ok" and arm.fault is None, (family, name, arm.to_dict())
            assert arm.max_num_seqs == (1 if family == "step_audio2" else 4)
            level = arm.levels[2].to_dict()
            assert level["requests"] == 2 and level["failed"] == 0 and level["audio_s"] == pytest.approx(2 * 2.0)
            first = arm.levels[2].run.requests[0]
            assert len(first.deliveries) >= 2  # streamed: two chunks 20 ms apart, not one reply
            assert first.ttfp_s() < first.deliveries[-1][0] - first.arrival_s
    from vllm_omni_token2wav.benchmarks.engine_ab import report as engine_ab_report

    assert "route pipeline: upstream's own pipeline at toy size" in engine_ab_report.render_text(report)
