# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav serve` on 127.0.0.1, as clients reach it: speech, codec ids, faults, the Seed-TTS driver.

Two served deployments, each started once per session (`conftest.py`) and shared by these tests:

- `standin_step_audio2_stream.yaml` (stand-in producer -> our code2wav): vLLM-Omni's
  `/v1/audio/speech` with its Step-Audio2 adapter. The producer's `max_tokens` (300 here, conftest.py
  `PRODUCER_REPLY_TOKENS`) makes every reply 300 codes, 12 s of 24 kHz audio in 12 chunks. Concurrent
  requests must each get a whole, valid WAV; a client that
  drops its connection mid-stream must not leave its stream in the stage (live streams back to 0,
  freed by the engine's finish, not by a last chunk) nor stop the server; `bench seed-tts serve` must
  drive the endpoint end to end (stand-in audio is noise: the plumbing is checked, not the WER).
- `step_audio2_code2wav.yaml`: `/v1/completions` with codec ids as the prompt runs the stage alone; an
  out-of-range code is an HTTP error naming the problem, and the next request succeeds.
"""

from __future__ import annotations

import http.client
import io
import json
import os
import shutil
import subprocess
import sys
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e.conftest import PRODUCER_REPLY_TOKENS, REPO_ROOT, Served
from tests.e2e.engines import SAMPLES_PER_TOKEN, wait_for
from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the served engine tests")

REPLY_TOKENS = PRODUCER_REPLY_TOKENS["standin_step_audio2_stream"]  # the producer's max_tokens as served here
TIMEOUT_S = 180.0


def _post(served: Served, path: str, body: dict[str, Any], timeout: float = TIMEOUT_S) -> tuple[int, bytes, str]:
    parts = urlsplit(served.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read(), resp.getheader("Content-Type", "")
    finally:
        conn.close()


def _speech(served: Served, text: str, **extra: Any) -> tuple[int, bytes, str]:
    body = {"model": str(served.model), "input": text, "response_format": "wav", **extra}
    return _post(served, "/v1/audio/speech", body)


def _wav(body: bytes) -> tuple[int, int, int, int]:
    """(rate, channels, sample width, frames) of a complete WAV body."""
    with wave.open(io.BytesIO(body)) as w:
        frames = w.getnframes()
        data = w.readframes(frames)
        assert len(data) == frames * w.getnchannels() * w.getsampwidth(), "WAV shorter than its header says"
        return w.getframerate(), w.getnchannels(), w.getsampwidth(), frames


def _assert_whole_reply(status: int, body: bytes, served: Served) -> None:
    assert status == 200, (status, body[:500], served.log_tail())
    assert _wav(body) == (24000, 1, 2, SAMPLES_PER_TOKEN * REPLY_TOKENS)


def test_concurrent_speech_requests_each_get_a_whole_24khz_mono_wav(stream_server: Served) -> None:
    texts = ["Hello there.", "A somewhat longer sentence to read aloud.", "Short."]
    before = stream_server.counters()["multi_request_steps"] if stream_server.stats_path.exists() else 0
    with ThreadPoolExecutor(len(texts)) as pool:
        replies = list(pool.map(lambda t: _speech(stream_server, t), texts))
    for status, body, content_type in replies:
        _assert_whole_reply(status, body, stream_server)
        assert content_type.startswith("audio/wav"), content_type
    counters = stream_server.counters()
    assert counters["multi_request_steps"] > before and counters["live_streams"] == 0, counters.raw


def test_a_client_that_disconnects_mid_stream_frees_its_stream_and_the_server_keeps_serving(
    stream_server: Served,
) -> None:
    _assert_whole_reply(*_speech(stream_server, "Warm up.")[:2], stream_server)  # the stage's counters exist
    known = set(stream_server.counters()["chunks"])
    tokens = REPLY_TOKENS  # 12 chunks; the endpoint ignores a request's max_new_tokens (conftest.py)
    body = {
        "model": str(stream_server.model),
        "input": "Please read this very long text.",
        "stream": True,
        "stream_format": "audio",  # raw PCM bytes as they are decoded (stream=true alone means SSE events)
        "response_format": "pcm",
    }
    parts = urlsplit(stream_server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=TIMEOUT_S)
    conn.request(
        "POST", "/v1/audio/speech", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    assert resp.status == 200, resp.read(500)
    assert resp.read1(4096), "no audio bytes before the disconnect"
    conn.sock.close()  # the client goes away mid-stream, without reading the rest
    conn.close()

    def freed() -> dict[str, Any] | None:
        counters = stream_server.counters()
        new = [k for k in counters["chunks"] if k not in known]
        return counters.raw if new and counters["live_streams"] == 0 else None

    counters = wait_for(freed, timeout_s=60, what="the dropped request's stream is freed (live_streams 0)")
    (key,) = [k for k in counters["chunks"] if k not in known]
    served = counters["chunks"][key]
    assert not any(last for _, last in served), f"{key} ran to its last chunk: the disconnect did not stop it"
    assert len(served) < tokens // 25  # fewer chunks than the whole reply has
    _assert_whole_reply(*_speech(stream_server, "Still here?")[:2], stream_server)


def test_bench_seed_tts_serve_drives_the_speech_endpoint_end_to_end(stream_server: Served, tmp_path: Path) -> None:
    from vllm_omni_token2wav.assets.audio import speech_sample_path

    data = tmp_path / "set"
    data.mkdir()
    shutil.copy(speech_sample_path(), data / "prompt.wav")
    lines = [
        "utt1|A prompt transcript.|prompt.wav|The first sentence to say.",
        "utt2|A prompt transcript.|prompt.wav|A second, longer sentence to say aloud.",
        "utt3|A prompt transcript.|prompt.wav|Third.",
    ]
    (data / "meta.lst").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "vllm_omni_token2wav",
        "bench",
        "seed-tts",
        "serve",
        "--meta",
        str(data / "meta.lst"),
        "--base-url",
        stream_server.url,
        "--model",
        str(stream_server.model),
        "--max-concurrency",
        "3",
        "--no-score",
        "--no-progress",
        "--no-histogram",
        "--output-dir",
        str(out),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT, env=dict(os.environ))
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])  # 0: done (docs/benchmarks/seed_tts.md)
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert sorted(r["utt"] for r in rows) == ["utt1", "utt2", "utt3"]
    assert [r["status"] for r in rows] == ["ok"] * 3, rows
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"]["counts"]["ok"] == 3 and not summary["requests"]["counts"].get("bad_body"), summary
    for utt in ("utt1", "utt2", "utt3"):
        rate, channels, width, frames = _wav((out / "audio" / f"{utt}.wav").read_bytes())
        assert (rate, channels, width, frames) == (24000, 1, 2, SAMPLES_PER_TOKEN * REPLY_TOKENS)


def test_a_bad_code_is_an_http_error_naming_it_and_the_next_request_succeeds(code2wav_server: Served) -> None:
    model = str(code2wav_server.model)
    bad = [100 + i for i in range(12)]
    bad[4] = 6561
    status, body, _ = _post(code2wav_server, "/v1/completions", {"model": model, "prompt": bad, "max_tokens": 1})
    assert status == 500, (status, body[:500])  # the request's error, as docs/design/engine_plugin.md says
    error = json.loads(body)["error"]
    assert error["code"] == 500 and "speech token 6561 at position 4 is outside [0, 6561)" in error["message"], error
    good = [200 + 3 * i for i in range(40)]
    status, body, _ = _post(code2wav_server, "/v1/completions", {"model": model, "prompt": good, "max_tokens": 1})
    assert status == 200, (status, body[:500], code2wav_server.log_tail())
    counters = code2wav_server.counters()
    assert counters["errors"] == 1 and [[40, True]] in counters["chunks"].values(), counters.raw
