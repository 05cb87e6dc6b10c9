# SPDX-License-Identifier: Apache-2.0
"""Which 200 bodies are the requested s16le mono PCM: containers and error pages built independently."""

from __future__ import annotations

import io
import struct
import wave

import numpy as np
import pytest
import soundfile as sf

from vllm_omni_token2wav.benchmarks.seed_tts.body import check_speech_body, quote_head

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

RATE = 24000


@pytest.fixture(scope="module")
def samples() -> np.ndarray:
    """0.2 s of a decaying tone, int16 (starts near silence like speech)."""
    t = np.arange(int(0.2 * RATE)) / RATE
    return np.round(9000 * np.sin(2 * np.pi * 220 * t) * np.minimum(1.0, 40 * t)).astype("<i2")


def _wav(samples: np.ndarray, rate: int = RATE, channels: int = 1, subtype: str = "PCM_16") -> bytes:
    buf = io.BytesIO()
    data = np.repeat(samples[:, None], channels, axis=1) if channels > 1 else samples
    sf.write(buf, data, rate, format="WAV", subtype=subtype)
    return buf.getvalue()


def test_raw_pcm_is_audio_as_is(samples: np.ndarray) -> None:
    for content_type in ("audio/pcm", "application/octet-stream", None, "audio/L16; rate=24000; channels=1"):
        verdict = check_speech_body(samples.tobytes(), content_type, RATE)
        assert verdict.status == "ok" and verdict.pcm == samples.tobytes(), content_type


def test_a_matching_wav_container_gives_its_samples_not_its_header(samples: np.ndarray) -> None:
    verdict = check_speech_body(_wav(samples), "audio/wav", RATE)
    assert verdict.status == "ok" and verdict.container == "wav"
    assert np.array_equal(np.frombuffer(verdict.pcm, dtype="<i2"), samples)


def test_a_wav_with_a_list_chunk_and_a_streaming_size_placeholder(samples: np.ndarray) -> None:
    """Written with the stdlib `wave` module, then given a LIST chunk and data size 0xFFFFFFFF (streaming)."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(samples.tobytes())
    data = buf.getvalue()
    at = data.index(b"data")
    listed = data[:at] + b"LIST" + struct.pack("<I", 5) + b"INFOx\x00" + b"data" + b"\xff\xff\xff\xff" + data[at + 8 :]
    verdict = check_speech_body(listed, None, RATE)
    assert verdict.status == "ok" and verdict.pcm == samples.tobytes()


@pytest.mark.parametrize("cut", [6, 30, 44 + 100, -1001])
def test_a_cut_wav_is_truncated(samples: np.ndarray, cut: int) -> None:
    verdict = check_speech_body(_wav(samples)[:cut], "audio/wav", RATE)
    assert verdict.status == "truncated" and verdict.error


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [({"rate": 16000}, "16000 Hz"), ({"channels": 2}, "2 channels"), ({"subtype": "FLOAT"}, "format 0x0003")],
)
def test_a_wav_of_another_format_is_a_bad_body(samples: np.ndarray, kwargs: dict, needle: str) -> None:
    verdict = check_speech_body(_wav(samples, **kwargs), "audio/wav", RATE)
    assert verdict.status == "bad_body" and needle in verdict.error and verdict.head.startswith("b'RIFF")


@pytest.mark.parametrize(
    ("content_type", "body", "kind"),
    [
        ("application/json", b'{"error": {"message": "bad ref_audio", "code": 400}}', "json"),
        ("audio/pcm", b'{"error": "stage crashed"}', "json"),
        (None, b"  <!DOCTYPE html>\n<html><head><title>502</title></head></html>", "html"),
        ("text/plain; charset=utf-8", "Fehler: Überlast\n".encode(), "text"),
        ("application/octet-stream", b"upstream connect error or disconnect/reset before headers", "text"),
    ],
)
def test_error_pages_are_bad_bodies_quoting_their_first_bytes(content_type: str | None, body: bytes, kind: str) -> None:
    verdict = check_speech_body(body, content_type, RATE)
    assert verdict.status == "bad_body" and verdict.container == kind
    assert verdict.head == repr(body[:64]) + ("..." if len(body) > 64 else "")
    assert verdict.head in verdict.error and verdict.pcm == b""


@pytest.mark.parametrize(
    ("content_type", "needle"),
    [
        ("audio/mpeg", "audio/mpeg"),
        ("audio/wav", "not a RIFF/WAVE"),
        ("audio/L16; rate=16000", "rate 16000"),
        ("audio/L16; rate=24000; channels=2", "2 channels"),
    ],
)
def test_binary_bodies_that_contradict_the_request_are_bad(samples: np.ndarray, content_type: str, needle: str) -> None:
    verdict = check_speech_body(samples.tobytes(), content_type, RATE)
    assert verdict.status == "bad_body" and needle in verdict.error


def test_odd_length_pcm_is_truncated_and_an_empty_body_is_no_audio(samples: np.ndarray) -> None:
    assert check_speech_body(samples.tobytes()[:-1], "audio/pcm", RATE).status == "truncated"
    assert check_speech_body(b"", "audio/pcm", RATE).status == "no_audio"
    assert check_speech_body(_wav(samples[:0]), "audio/wav", RATE).status == "no_audio"


def test_quote_head_marks_a_cut_quote() -> None:
    assert quote_head(b"x" * 70) == repr(b"x" * 64) + "..."
    assert quote_head(b"short") == "b'short'"
