# SPDX-License-Identifier: Apache-2.0
"""Upstream's toy Step-Audio2 and MiniCPM-o pipelines served by `vllm-omni-token2wav serve`, our code2wav behind them.

The deployments of `test_upstream_pipelines.py` (upstream's deploy YAML over the toy folder, `standin/toy/`)
served on 127.0.0.1, with the reply length pinned in the deployment (a served request cannot set every stage's
params; `benchmarks/engine_ab/pipeline.py` `reply_overrides`, what `bench engine-ab --route pipeline` serves):

- Step-Audio2 (`step_audio_2_async_chunk.yaml`): `POST /v1/audio/speech` (upstream's speech adapter builds the
  prompt): three concurrent requests each get a whole 24 kHz mono WAV of exactly the pinned codes x 960
  samples, and a streamed request (raw PCM) as many samples, in more than one read.
- MiniCPM-o 4.5 (`minicpmo_4_5_turn.yaml`): `POST /v1/chat/completions` with `modalities: [text, audio]`
  (the toy chat template renders the messages): three concurrent requests each get text and a 24 kHz WAV in
  `message.audio.data`, of the length the code2wav stage served (its counters: 960 samples per code voiced);
  a streamed request gets base64 WAV deltas.

One server at a time (module-scoped, parametrized); ready in 2-4 minutes on the 2-core host.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import time
import wave
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.engines import SAMPLES_PER_TOKEN, StageCounters
from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("upstream's toy pipelines served")

#: Codes per served reply (the deployment's).
TOKENS = 40
TIMEOUT_S = 300.0
STARTUP_TIMEOUT_S = 900.0


@dataclass
class ServedToy:
    family: str
    server: Any
    model: Path
    stats_path: Path

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=TIMEOUT_S)
        try:
            conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            reply = conn.getresponse()
            return reply.status, reply.read()
        finally:
            conn.close()

    def log_tail(self) -> str:
        return "\n".join(self.server.log_path.read_text(errors="replace").splitlines()[-40:])


@pytest.fixture(scope="module", params=["step_audio2", "minicpmo_4_5"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedToy]:
    from vllm_omni_token2wav import envs
    from vllm_omni_token2wav.benchmarks.engine_ab.pipeline import reply_overrides
    from vllm_omni_token2wav.benchmarks.engine_server import EngineServer
    from vllm_omni_token2wav.model_executor.models.standin.toy import TOY_PIPELINES

    family = request.param
    tmp = tmp_path_factory.mktemp(f"served_{family}")
    pipeline = TOY_PIPELINES[family]
    model = pipeline.ensure_model_dir()
    deploy = pipeline.deployment(model, tmp, async_chunk=True, stage_overrides=reply_overrides(family, TOKENS))
    stats = tmp / "stage_stats.json"
    server = EngineServer(
        model=model,
        deploy=deploy,
        log_path=tmp / "serve.log",
        env={envs.STAGE_STATS_ENV: str(stats)},
        startup_timeout_s=STARTUP_TIMEOUT_S,
    )
    started = time.monotonic()
    server.start()
    print(f"{family} served: ready in {time.monotonic() - started:.0f} s")
    try:
        yield ServedToy(family, server, model, stats)
    finally:
        server.stop()


def _wav(data: bytes) -> tuple[int, int, int, int]:
    with wave.open(io.BytesIO(data)) as w:
        return w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()


def _chat(text: str, *, stream: bool) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], "modalities": ["text", "audio"], "stream": stream}


def test_concurrent_requests_each_get_a_whole_24khz_wav(served: ServedToy, request: pytest.FixtureRequest) -> None:
    if served.family == "step_audio2":
        # Seen once, in a full-suite run on a loaded host (2026-12-05): one of the three whole-WAV replies was
        # HTTP 400 "TTS model did not produce audio output" although the stage's counters show all three voiced
        # without error; the same test passed alone (3 runs) and in the helper's runs. Not understood yet: kept
        # visible as a non-strict xfail rather than retried (closing note of issue 30).
        request.applymarker(
            pytest.mark.xfail(strict=False, reason="intermittent HTTP 400 on one whole-WAV reply under load")
        )
    texts = ["Hello there.", "A somewhat longer sentence to read aloud.", "Short."]
    if served.family == "step_audio2":
        bodies = [
            ("/v1/audio/speech", {"model": str(served.model), "input": t, "response_format": "wav"}) for t in texts
        ]
    else:
        bodies = [("/v1/chat/completions", {"model": str(served.model), **_chat(t, stream=False)}) for t in texts]
    started = time.monotonic()
    with ThreadPoolExecutor(len(bodies)) as pool:
        replies = list(pool.map(lambda pb: served.post(*pb), bodies))
    print(f"{served.family} served: 3 concurrent requests in {time.monotonic() - started:.1f} s")
    counters = StageCounters.read(served.stats_path)
    voiced = []
    for key, chunks in counters["chunks"].items():  # MiniCPM-o chunks repeat 3 context codes after the first
        tokens = sum(n for n, _ in chunks) - (3 * (len(chunks) - 1) if served.family == "minicpmo_4_5" else 0)
        voiced.append((key, tokens))
    assert len(voiced) == 3 and counters["errors"] == 0, counters.raw
    for status, body in replies:
        assert status == 200, (status, body[:500], served.log_tail())
        if served.family == "step_audio2":
            assert _wav(body) == (24000, 1, 2, TOKENS * SAMPLES_PER_TOKEN)
            continue
        message = json.loads(body)["choices"]
        texts_out = [c["message"].get("content") for c in message if c["message"].get("content")]
        audio = [c["message"]["audio"]["data"] for c in message if c["message"].get("audio")]
        assert texts_out and len(audio) == 1, message
        rate, channels, width, frames = _wav(base64.b64decode(audio[0]))
        assert (rate, channels, width) == (24000, 1, 2)
        assert frames in {n * SAMPLES_PER_TOKEN for _, n in voiced}, (frames, voiced)


def test_a_streamed_request_delivers_its_audio_in_several_reads(served: ServedToy) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", served.server.port, timeout=TIMEOUT_S)
    try:
        if served.family == "step_audio2":
            body = {"model": str(served.model), "input": "Stream this, please.", "response_format": "pcm"}
            body |= {"stream": True, "stream_format": "audio"}
            conn.request(
                "POST", "/v1/audio/speech", body=json.dumps(body), headers={"Content-Type": "application/json"}
            )
        else:
            body = {"model": str(served.model), **_chat("Stream this, please.", stream=True)}
            conn.request(
                "POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"}
            )
        reply = conn.getresponse()
        assert reply.status == 200, (reply.read(500), served.log_tail())
        reads = []
        while chunk := reply.read1(1 << 16):
            reads.append(chunk)
    finally:
        conn.close()
    data = b"".join(reads)
    if served.family == "step_audio2":
        assert len(data) == 2 * TOKENS * SAMPLES_PER_TOKEN and len(reads) > 1
        return
    deltas = []
    for line in data.split(b"\n"):
        if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
            for choice in json.loads(line[5:]).get("choices", []):
                content = (choice.get("delta") or {}).get("content")
                if isinstance(content, str) and content.startswith("UklGR"):
                    deltas.append(_wav(base64.b64decode(content)))
    assert len(deltas) > 1 and all(d[:3] == (24000, 1, 2) for d in deltas), deltas
    assert sum(d[3] for d in deltas) > 0
