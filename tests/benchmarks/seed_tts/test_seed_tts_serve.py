# SPDX-License-Identifier: Apache-2.0
"""Serve mode against a local speech server on 127.0.0.1 that streams PCM or misbehaves on purpose."""

from __future__ import annotations

import base64
import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from tests.helpers.asr import KeyedASR
from vllm_omni_token2wav.benchmarks.seed_tts.dataset import load_seed_tts_meta
from vllm_omni_token2wav.benchmarks.seed_tts.serve import REQUESTS_FILE, ServeConfig, run_requests, serve_and_score

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

PCM_RATE = 24000
FIRST_CHUNK_DELAY_S = 0.05
CLIENT_TIMEOUT_S = 1.0


HANG_CHUNKS = 50  # 5 s of slow streaming
# 200 responses whose body is not audio (mode -> Content-Type, body).
BAD_BODIES = {
    "json": ("application/json", b'{"error": {"message": "CUDA out of memory", "code": 500}}'),
    "html": ("text/html", b"<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1></body></html>"),
    "textpcm": ("audio/pcm", b"Internal Server Error: the speech stage crashed\n"),
}


def wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    """A PCM16 mono WAV file of `samples` (written by soundfile, not by the code under test)."""
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def pcm_for(text: str) -> np.ndarray:
    """The server's audio for a target text: a tone whose length (0.1 s per word) identifies the text."""
    n = int(0.1 * len(text.split()) * PCM_RATE)
    t = np.arange(n) / PCM_RATE
    return np.round(8000 * np.sin(2 * np.pi * 300 * t)).astype("<i2")


class SpeechServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), SpeechHandler)
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.healthy = False  # True: every request succeeds (the "fixed server" for resume)
        self.hang_completed = False  # whether a "hang" stream was sent to its end

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class SpeechHandler(BaseHTTPRequestHandler):
    server: SpeechServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default per-request stderr log."""

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        with srv.lock:
            srv.requests.append({"path": self.path, **body})
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
        try:
            self._respond(body, "ok" if srv.healthy else body["input"].split()[0])
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with srv.lock:
                srv.in_flight -= 1

    def _send(self, content_type: str, payload: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _respond(self, body: dict[str, Any], mode: str) -> None:
        pcm = pcm_for(body["input"]).tobytes()
        if mode in BAD_BODIES:
            self._send(*BAD_BODIES[mode])
            return
        if mode.startswith("wav"):  # a WAV container instead of raw PCM: whole, cut, or at another rate
            rate = 16000 if mode == "wav16k" else PCM_RATE
            data = wav_bytes(pcm_for(body["input"]), rate)
            self._send("audio/wav", data[: len(data) // 2] if mode == "wavcut" else data)
            return
        if mode == "hang":  # streams audio slowly for several seconds (the Ctrl-C test stops it early)
            self.send_response(200)
            self.send_header("Content-Type", "audio/pcm")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            piece = pcm[:4800]
            for _ in range(HANG_CHUNKS):
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                self.wfile.flush()
                time.sleep(0.1)
            self.wfile.write(b"0\r\n\r\n")
            self.server.hang_completed = True
            return
        if mode == "fail":
            err = b'{"error": "synthesis crashed"}'
            self.send_response(500)
            self.send_header("Content-Length", str(len(err)))
            self.end_headers()
            self.wfile.write(err)
            return
        if mode == "cut":  # Content-Length promises more than is sent
            self.send_response(200)
            self.send_header("Content-Length", str(len(pcm)))
            self.end_headers()
            self.wfile.write(pcm[: len(pcm) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if mode == "slow":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            time.sleep(3 * CLIENT_TIMEOUT_S)
            return
        if mode == "empty":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        time.sleep(FIRST_CHUNK_DELAY_S)
        half = (len(pcm) // 4) * 2
        for piece in (pcm[:half], pcm[half:]):
            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.flush()
            if mode == "chunkcut":  # the stream stops after the first chunk, without the final 0-chunk
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            time.sleep(0.01)
        self.wfile.write(b"0\r\n\r\n")


@pytest.fixture
def server() -> Iterator[SpeechServer]:
    srv = SpeechServer()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def write_meta(folder: Path, lines: list[tuple[str, str]]) -> Path:
    """`folder/meta.lst` with one item per (utt, target text), all sharing one short prompt wav."""
    prompts = folder / "prompts"
    prompts.mkdir(exist_ok=True)
    sf.write(prompts / "ref.wav", np.zeros(1600, dtype=np.float32), 16000, subtype="PCM_16")
    path = folder / "meta.lst"
    path.write_text("".join(f"{u}|prompt words|prompts/ref.wav|{t}\n" for u, t in lines), encoding="utf-8")
    return path


@pytest.fixture
def meta(tmp_path: Path) -> Path:
    """Target texts start with the server behaviour they trigger."""
    lines = [
        ("a", "ok the weather is fine"),
        ("b", "ok two words more here now"),
        ("c", "fail this request"),
        ("d", "cut body in half"),
        ("e", "chunkcut after first chunk"),
        ("f", "slow server never answers"),
        ("g", "empty body"),
    ]
    return write_meta(tmp_path, lines)


def _cfg(url: str, concurrency: int = 3) -> ServeConfig:
    return ServeConfig(base_url=url, model="tts-test", max_concurrency=concurrency, timeout_s=CLIENT_TIMEOUT_S)


def test_failures_are_counted_per_category_and_good_audio_is_saved(
    server, meta: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    rows = run_requests(load_seed_tts_meta(meta), _cfg(server.url), out, progress=True)
    # Progress in a log (stderr is not a terminal here): whole lines, never carriage-return redraws.
    err = capsys.readouterr().err
    assert "\r" not in err and "requests: 7/7 req (100 %" in err
    assert "c: http_error (HTTP 500" in err
    assert {u: r["status"] for u, r in rows.items()} == {
        "a": "ok",
        "b": "ok",
        "c": "http_error",
        "d": "truncated",
        "e": "truncated",
        "f": "timeout",
        "g": "no_audio",
    }
    assert rows["c"]["http_status"] == 500 and "synthesis crashed" in rows["c"]["error"]

    # What the server received: the OpenAI speech request with the prompt as a data URL.
    sent = {r["input"]: r for r in server.requests}
    req = sent["ok the weather is fine"]
    assert req["path"] == "/v1/audio/speech" and req["model"] == "tts-test"
    assert req["stream"] is True and req["response_format"] == "pcm" and req["ref_text"] == "prompt words"
    assert req["stream_format"] == "audio"  # raw PCM bytes, not SSE events (vLLM-Omni's default for stream=true)
    assert req["ref_audio"].startswith("data:audio/wav;base64,")
    ref_bytes = base64.b64decode(req["ref_audio"].split(",", 1)[1])
    assert ref_bytes == (meta.parent / "prompts" / "ref.wav").read_bytes()

    # Saved audio equals the streamed PCM; timing fields are consistent with the server's delays.
    for utt, text in (("a", "ok the weather is fine"), ("b", "ok two words more here now")):
        row = rows[utt]
        saved, rate = sf.read(out / "audio" / f"{utt}.wav", dtype="int16")
        assert rate == PCM_RATE and np.array_equal(saved, pcm_for(text))
        assert row["audio_s"] == pytest.approx(len(pcm_for(text)) / PCM_RATE, abs=1e-4)
        assert FIRST_CHUNK_DELAY_S <= row["ttfp_s"] <= row["e2e_s"]
        assert row["rtf"] == pytest.approx(row["e2e_s"] / row["audio_s"], rel=1e-3)
    assert not (out / "audio" / "d.wav").exists() and not (out / "audio" / "f.wav").exists()
    assert len((out / REQUESTS_FILE).read_text().splitlines()) == 7


def test_resume_only_requests_what_did_not_succeed(server, meta: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    dataset = load_seed_tts_meta(meta)
    run_requests(dataset, _cfg(server.url), out)
    server.requests.clear()
    server.healthy = True
    rows = run_requests(dataset, _cfg(server.url), out, resume=True)
    assert sorted(r["input"].split()[0] for r in server.requests) == ["chunkcut", "cut", "empty", "fail", "slow"]
    assert all(r["status"] == "ok" for r in rows.values())
    assert sorted(p.stem for p in (out / "audio").glob("*.wav")) == list("abcdefg")


def test_concurrency_is_bounded(server, meta: Path, tmp_path: Path) -> None:
    server.healthy = True
    rows = run_requests(load_seed_tts_meta(meta), _cfg(server.url, concurrency=2), tmp_path / "out")
    assert all(r["status"] == "ok" for r in rows.values())
    # Each request takes >= 60 ms server-side and all 7 are queued at once, so two overlap but never three.
    assert server.max_in_flight == 2


def word_count_asr(by_words: dict[int, str]) -> KeyedASR:
    """Transcribes the server's tones: duration / 0.1 s (at the 16 kHz ASR rate) words of the target text."""
    return KeyedASR("word-count-stub", by_words, key=lambda audio: round(len(audio) / 1600))


def test_serve_then_score_reports_request_counts_and_strict_wer(server, meta: Path, tmp_path: Path) -> None:
    texts = [it.target_text for it in load_seed_tts_meta(meta).items]
    asr = word_count_asr({len(t.split()): t for t in texts})
    summary = serve_and_score(load_seed_tts_meta(meta), _cfg(server.url, 2), tmp_path / "out", lambda: asr)
    assert summary["requests"]["counts"] == {
        "ok": 2,
        "http_error": 1,
        "truncated": 2,
        "timeout": 1,
        "connection_error": 0,
        "no_audio": 1,
        "bad_body": 0,
        "not_attempted": 0,
    }
    assert summary["requests"]["ttfp_s"]["mean"] >= FIRST_CHUNK_DELAY_S
    # The two delivered items are transcribed perfectly; the five failed ones only count in the strict view.
    assert summary["official"]["wer_mean"] == 0.0 and summary["official"]["n"] == 2
    assert summary["strict"]["wer_mean"] == round(100 * 5 / 7, 3)
    assert summary["counts"]["missing_audio"] == 5


def test_unreachable_server_is_a_connection_error(meta: Path, tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the block ends: nothing listens there
    dataset = load_seed_tts_meta(meta, subset=1)
    rows = run_requests(dataset, _cfg(f"http://127.0.0.1:{port}"), tmp_path / "out")
    assert rows["a"]["status"] == "connection_error"


def test_missing_prompt_wav_stops_before_any_request(server, tmp_path: Path) -> None:
    path = tmp_path / "meta.lst"
    path.write_text("a|p|nowhere.wav|ok text\n", encoding="utf-8")
    with pytest.raises(FileNotFoundError, match="prompt wav\\(s\\) missing"):
        run_requests(load_seed_tts_meta(path), _cfg(server.url), tmp_path / "out")
    assert server.requests == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"base_url": "localhost:8000"}, "base URL"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"timeout_s": 0}, "timeout"),
    ],
)
def test_bad_serve_config_is_rejected(kwargs: dict[str, Any], match: str) -> None:
    args = {"base_url": "http://127.0.0.1:1", "model": "m", **kwargs}
    with pytest.raises(ValueError, match=match):
        ServeConfig(**args)


@pytest.fixture
def odd_bodies_meta(tmp_path: Path) -> Path:
    """Items whose 200 response is not the requested raw PCM (plus one good item); the two audio items
    have word counts no other item has, so `word_count_asr` transcribes them unambiguously."""
    lines = [
        ("a", "ok fine"),
        ("j", "json error page here"),
        ("h", "html gateway page"),
        ("t", "textpcm labelled as audio"),
        ("w", "wav container whole and right for sure"),
        ("x", "wavcut container cut in half"),
        ("r", "wav16k at the wrong rate"),
    ]
    return write_meta(tmp_path, lines)


def test_bodies_that_are_not_the_requested_audio_are_never_saved_as_audio(
    server, odd_bodies_meta: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    rows = run_requests(load_seed_tts_meta(odd_bodies_meta), _cfg(server.url), out)
    assert {u: r["status"] for u, r in rows.items()} == {
        "a": "ok",
        "j": "bad_body",
        "h": "bad_body",
        "t": "bad_body",
        "w": "ok",
        "x": "truncated",
        "r": "bad_body",
    }
    # The row quotes the first bytes of what came back, and the Content-Type.
    for utt, mode in (("j", "json"), ("h", "html"), ("t", "textpcm")):
        content_type, body = BAD_BODIES[mode]
        assert rows[utt]["body_head"] == repr(body[:64]) + ("..." if len(body) > 64 else "")
        assert rows[utt]["content_type"] == content_type
        assert rows[utt]["audio_s"] is None and rows[utt]["rtf"] is None
    assert "16000 Hz" in rows["r"]["error"] and "24000" in rows["r"]["error"]
    assert "declares" in rows["x"]["error"]
    # A WAV container that matches the request is audio: its samples, not its header, are saved.
    saved, rate = sf.read(out / "audio" / "w.wav", dtype="int16")
    assert rate == PCM_RATE and np.array_equal(saved, pcm_for("wav container whole and right for sure"))
    assert rows["w"]["audio_s"] == pytest.approx(len(saved) / PCM_RATE, abs=1e-4)
    assert sorted(p.stem for p in (out / "audio").glob("*.wav")) == ["a", "w"]


def test_bad_bodies_are_counted_shown_and_kept_out_of_scoring_and_rtf(
    server, odd_bodies_meta: Path, tmp_path: Path
) -> None:
    from vllm_omni_token2wav.benchmarks.seed_tts.evaluate import format_summary_table

    texts = [it.target_text for it in load_seed_tts_meta(odd_bodies_meta).items]
    asr = word_count_asr({len(t.split()): t for t in texts})
    summary = serve_and_score(load_seed_tts_meta(odd_bodies_meta), _cfg(server.url), tmp_path / "out", lambda: asr)
    counts = summary["requests"]["counts"]
    assert counts["bad_body"] == 4 and counts["ok"] == 2 and counts["truncated"] == 1
    requests = [json.loads(line) for line in (tmp_path / "out" / REQUESTS_FILE).read_text().splitlines()]
    ok_rtfs = sorted(r["rtf"] for r in requests if r["status"] == "ok")
    assert summary["requests"]["rtf"]["max"] == pytest.approx(ok_rtfs[-1], abs=1e-4)
    assert summary["requests"]["rtf"]["mean"] == pytest.approx(sum(ok_rtfs) / 2, abs=1e-4)
    # Only the two audio bodies were transcribed; the others are missing audio in the strict view.
    assert summary["official"]["n"] == 2 and summary["official"]["wer_mean"] == 0.0
    assert summary["counts"]["missing_audio"] == 5
    assert "bad_body=4" in format_summary_table(summary)


def test_elapsed_covers_the_request_phase(server, meta: Path, tmp_path: Path) -> None:
    texts = [it.target_text for it in load_seed_tts_meta(meta).items]
    asr = word_count_asr({len(t.split()): t for t in texts})
    summary = serve_and_score(load_seed_tts_meta(meta), _cfg(server.url), tmp_path / "out", lambda: asr)
    # The "slow" item alone keeps the request phase open for the client timeout.
    assert summary["requests_elapsed_s"] >= CLIENT_TIMEOUT_S
    assert summary["elapsed_s"] >= summary["requests_elapsed_s"] + summary["asr_seconds_total"]
    from vllm_omni_token2wav.benchmarks.seed_tts.evaluate import format_summary_table

    assert f"requests {summary['requests_elapsed_s']:.1f} s" in format_summary_table(summary)


def test_ctrl_c_stops_requests_in_flight_and_writes_an_interrupted_summary(
    server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_omni_token2wav.benchmarks.seed_tts import results as seed_tts_results

    meta = write_meta(tmp_path, [("a", "ok quick one"), ("b", "hang streams for seconds")])
    real_append = seed_tts_results.JsonlLog.append

    def interrupt_after_first_row(self: Any, row: Any) -> None:
        real_append(self, row)
        raise KeyboardInterrupt  # Ctrl-C while "b" is still streaming

    monkeypatch.setattr(seed_tts_results.JsonlLog, "append", interrupt_after_first_row)
    out = tmp_path / "out"
    cfg = ServeConfig(base_url=server.url, model="m", max_concurrency=2, timeout_s=30.0)
    with pytest.raises(KeyboardInterrupt):
        serve_and_score(load_seed_tts_meta(meta), cfg, out, None)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert summary["requests"]["counts"]["ok"] == 1 and summary["requests"]["counts"]["not_attempted"] == 1
    # The streaming request was stopped (its connection closed) and saved nothing, even later.
    time.sleep(0.3)
    assert not server.hang_completed
    assert sorted(p.name for p in (out / "audio").iterdir()) == ["a.wav"]
    assert [json.loads(line)["utt"] for line in (out / REQUESTS_FILE).read_text().splitlines()] == ["a"]
