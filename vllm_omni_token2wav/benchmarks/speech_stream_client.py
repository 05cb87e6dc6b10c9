# SPDX-License-Identifier: Apache-2.0
"""Stream `/v1/audio/speech` replies as raw PCM and time every audio byte: the served benchmark's listener.

TTFP and underruns are about what a listener receives, so they are measured on the client side of
a real HTTP stream, not from the server's logs. vLLM-Omni 0.30's speech endpoint streams in two
forms (`OpenAICreateSpeechRequest`): `"stream": true` alone sends OpenAI `speech.audio.*` SSE events
(base64 audio inside JSON), and `"stream_format": "audio"` sends the raw bytes of each code2wav
chunk as soon as it is decoded (`serving_speech._generate_audio_chunks`). The raw form is used here
(`response_format` `pcm`: 16-bit mono little-endian at the stage's rate, no header; `wav` adds a
44-byte header with the rate, which a warm-up request reads to check the rate). Each read that
returns audio is one delivery `(seconds since the run's origin, samples)` of a `RequestResult`, the
record the emulated benchmark keeps too, so TTFP, RTF and underruns are computed by the same code.

Requests run in threads (`http.client`, one connection per request): at most a few dozen streams,
each a few reads per second, so the GIL is not what limits them. `run_closed_or_poisson` admits
requests as the emulated benchmark does: a closed loop of `concurrency` slots, or Poisson arrivals
with at most `concurrency` in flight (TTFP then counts the queueing).
"""

from __future__ import annotations

import http.client
import json
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vllm_omni_token2wav.benchmarks.token2wav_serve.run import RequestResult

SPEECH_PATH = "/v1/audio/speech"
PCM_BYTES_PER_SAMPLE = 2  # s16le mono
WAV_HEADER_BYTES = 44


class SpeechStreamError(RuntimeError):
    """A reply that is not a PCM/WAV stream (an HTTP error, a wrong content type, a bad header)."""


def speech_body(text: str, response_format: str = "pcm") -> dict[str, object]:
    """The request body: raw audio streaming of `text` (see the module docstring for the two stream forms)."""
    return {"input": text, "response_format": response_format, "stream": True, "stream_format": "audio"}


def error_message(body: bytes) -> str:
    """The server's `error.message` of an error reply, else the start of its body."""
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:300].decode(errors="replace")


def _error_text(status: int, body: bytes) -> str:
    return f"HTTP {status}: {error_message(body)}"


def stream_speech(
    port: int,
    text: str,
    result: RequestResult,
    origin: float,
    *,
    timeout_s: float = 300.0,
    response_format: str = "pcm",
) -> bytes:
    """POST `text` to the server on 127.0.0.1:`port`; fill `result.deliveries` (times since `origin`); the bytes.

    An HTTP error or a broken stream is appended to `result.errors` (the request fails alone).
    """
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    data = bytearray()
    try:
        conn.request(
            "POST",
            SPEECH_PATH,
            body=json.dumps(speech_body(text, response_format)),
            headers={"Content-Type": "application/json"},
        )
        reply = conn.getresponse()
        if reply.status != 200:
            result.errors.append(_error_text(reply.status, reply.read()))
            return bytes(data)
        skip = WAV_HEADER_BYTES if response_format == "wav" else 0
        counted = 0  # samples already delivered (a read may end inside a sample)
        while chunk := reply.read1(1 << 16):
            now = time.perf_counter() - origin
            data += chunk
            samples = max(0, len(data) - skip) // PCM_BYTES_PER_SAMPLE
            if samples > counted:
                result.deliveries.append((now, samples - counted))
                counted = samples
    except (OSError, http.client.HTTPException) as exc:
        result.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()
    return bytes(data)


def wav_rate(data: bytes) -> int:
    """The sample rate in a streamed WAV's header (mono 16-bit PCM expected), or `SpeechStreamError`."""
    if len(data) < WAV_HEADER_BYTES or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise SpeechStreamError(f"not a WAV stream (first bytes {data[:12]!r})")
    fmt, channels, rate = struct.unpack_from("<HHI", data, 20)
    bits = struct.unpack_from("<H", data, 34)[0]
    if (fmt, channels, bits) != (1, 1, 16):
        raise SpeechStreamError(f"expected mono 16-bit PCM WAV, got format {fmt}, {channels} channels, {bits} bits")
    return int(rate)


@dataclass(frozen=True)
class ServedRequest:
    """One request of a served level: its id (the report's), its text, and when it arrives (None: closed loop)."""

    request_id: str
    text: str
    arrival_s: float | None = None


#: How a request is sent: `(request, its result to fill, the level's origin)`; the default streams its text as speech.
Sender = Callable[[ServedRequest, RequestResult, float], object]


def run_closed_or_poisson(
    port: int,
    requests: Sequence[ServedRequest],
    concurrency: int,
    *,
    timeout_s: float = 300.0,
    send: Sender | None = None,
) -> list[RequestResult]:
    """Stream every request with at most `concurrency` in flight; their results, times since the level began.

    Closed loop (no arrival times): a request is sent as soon as a slot frees, and that is its arrival.
    Poisson (arrival times given): a request arrives at its time and waits for a slot. `send` replaces the
    speech stream for other endpoints (`bench engine-ab` posts codec ids); it fills the result the same way.
    """
    slots = threading.Semaphore(concurrency)
    results = [RequestResult(r.request_id, 0, 0, 0.0, 0.0) for r in requests]
    threads: list[threading.Thread] = []
    origin = time.perf_counter()

    def one(req: ServedRequest, result: RequestResult) -> None:
        try:
            if send is None:
                stream_speech(port, req.text, result, origin, timeout_s=timeout_s)
            else:
                send(req, result, origin)
        finally:
            slots.release()

    for req, result in zip(requests, results, strict=True):
        if req.arrival_s is not None:
            time.sleep(max(0.0, origin + req.arrival_s - time.perf_counter()))
        slots.acquire()
        admitted = time.perf_counter() - origin
        result.arrival_s = admitted if req.arrival_s is None else req.arrival_s
        result.admitted_s = admitted
        thread = threading.Thread(target=one, args=(req, result), name=f"speech-{req.request_id}", daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return results


__all__ = [
    "PCM_BYTES_PER_SAMPLE",
    "SPEECH_PATH",
    "Sender",
    "ServedRequest",
    "SpeechStreamError",
    "run_closed_or_poisson",
    "speech_body",
    "stream_speech",
    "wav_rate",
]
