# SPDX-License-Identifier: Apache-2.0
"""Drive an OpenAI-compatible speech endpoint over a Seed-TTS set, then score what came back.

For every item the driver POSTs `/v1/audio/speech` with `{model, input, stream: true, stream_format: "audio",
response_format: "pcm", ref_audio: <data URL of the prompt wav>, ref_text}` and reads the streamed body: raw
s16le mono PCM (24 kHz unless told otherwise). `stream_format: "audio"` is OpenAI's field for raw audio
bytes; vLLM-Omni 0.30 answers `stream: true` without it with `speech.audio.delta` SSE events (which the
body check counts as `bad_body`). It measures, per request:

- TTFP: seconds from sending the request to the first non-empty body chunk;
- e2e: seconds to the end of the body; audio RTF = e2e / audio duration (< 1 means faster than real time).

Requests run with bounded concurrency (`max_concurrency` threads, each with its own connection). A request
that fails is recorded with one category and never stops the run:

| status             | meaning                                                                  |
|--------------------|--------------------------------------------------------------------------|
| `ok`               | 200, complete body that is the requested audio (see `seed_tts_body`)     |
| `http_error`       | non-200 status (`http_status` and the start of the body are kept)        |
| `bad_body`         | 200, but the body is not the requested audio: JSON / HTML / text, a WAV  |
|                    | of another rate, width or channel count, another media type; the row     |
|                    | quotes its first bytes (`body_head`) and its `content_type`              |
| `truncated`        | body ended early (short chunked stream / Content-Length, reset, odd size, |
|                    | a WAV whose data is shorter than its header says)                        |
| `timeout`          | no byte for `timeout_s`, or the request exceeded its total deadline      |
| `connection_error` | could not connect, or the server closed before a status line             |
| `no_audio`         | 200 with an empty body (or a WAV container without samples)              |

Only `ok` rows are saved as audio (`<out_dir>/audio/<utt>.wav`), scored, and enter the TTFP / e2e / RTF
statistics. Rows go to `<out_dir>/requests.jsonl` as they complete. Scoring runs after all requests
finished, so the ASR does not compete with the server for the host while TTFP is measured.

Ctrl-C during the requests closes the connections of the requests in flight (they save nothing), writes
`summary.json` marked `"interrupted": true` with the rows completed so far, and re-raises.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from vllm_omni_token2wav.benchmarks.progress import progress as progress_bar
from vllm_omni_token2wav.benchmarks.seed_tts.asr import ASRBackend
from vllm_omni_token2wav.benchmarks.seed_tts.body import check_speech_body
from vllm_omni_token2wav.benchmarks.seed_tts.dataset import SeedTTSDataset, SeedTTSItem
from vllm_omni_token2wav.benchmarks.seed_tts.results import JsonlLog, read_jsonl_rows, write_bytes_atomic
from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

REQUESTS_FILE = "requests.jsonl"
AUDIO_DIR = "audio"
SPEECH_PATH = "/v1/audio/speech"
REQUEST_STATUSES = ("ok", "http_error", "bad_body", "truncated", "timeout", "connection_error", "no_audio")
# How often the request loop wakes up while waiting (so Ctrl-C is handled promptly).
_POLL_S = 0.25
# How long Ctrl-C waits for the cancelled requests to return before the summary is written.
_CANCEL_WAIT_S = 5.0

_MIME = {".wav": "audio/wav", ".flac": "audio/flac", ".mp3": "audio/mpeg", ".ogg": "audio/ogg"}


@dataclass(frozen=True)
class ServeConfig:
    """Where and how to send requests."""

    base_url: str
    model: str
    max_concurrency: int = 4
    timeout_s: float = 120.0
    sample_rate: int = 24_000
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    api_key: str | None = None

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base URL must look like http://host:port, got {self.base_url!r}")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout must be > 0 s, got {self.timeout_s}")
        if self.sample_rate <= 0:
            raise ValueError(f"sample rate must be > 0, got {self.sample_rate}")


@dataclass
class RequestRow:
    utt: str
    status: str
    http_status: int | None = None
    ttfp_s: float | None = None
    e2e_s: float | None = None
    audio_s: float | None = None
    rtf: float | None = None
    bytes: int = 0
    wav: str = ""
    error: str = ""
    content_type: str = ""
    body_head: str = ""  # bad_body: the first bytes of the body, as a bytes literal


class Cancellation:
    """Stops the requests in flight: `cancel()` shuts their sockets down, so blocked reads return at once.

    `fetch_speech` registers its connection while it runs and checks `cancelled` before it saves audio,
    so after `cancel()` no request writes anything.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._conns: set[http.client.HTTPConnection] = set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def register(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._conns.add(conn)

    def unregister(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._conns.discard(conn)

    def cancel(self) -> None:
        self._event.set()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed


class RequestsInterrupted(KeyboardInterrupt):
    """Ctrl-C during the request phase; `rows` are the requests completed before it (by utterance)."""

    def __init__(self, rows: dict[str, dict[str, Any]]) -> None:
        super().__init__("interrupted during the request phase")
        self.rows = rows


def data_url(path: Path) -> str:
    """The prompt audio as a `data:` URL (the endpoint's `ref_audio` field)."""
    mime = _MIME.get(path.suffix.lower(), "application/octet-stream")
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def request_body(item: SeedTTSItem, cfg: ServeConfig) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": cfg.model,
        "input": item.target_text,
        "stream": True,
        "stream_format": "audio",  # raw bytes: vLLM-Omni 0.30 sends SSE events for stream=true without it
        "response_format": "pcm",
        "ref_audio": data_url(item.prompt_wav),
        "ref_text": item.prompt_text,
    }
    body.update(cfg.extra_body)
    return body


def _connection(cfg: ServeConfig, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(cfg.base_url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname or "", parts.port, timeout=timeout)
    prefix = parts.path.rstrip("/")
    if prefix.endswith("/v1"):
        prefix = prefix[: -len("/v1")]
    return conn, prefix + SPEECH_PATH


def save_pcm_wav(pcm: bytes, rate: int, path: Path) -> None:
    """Write s16le mono `pcm` as a PCM16 wav, atomically."""
    import io

    import soundfile as sf

    samples = np.frombuffer(pcm, dtype="<i2")
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype="PCM_16")
    write_bytes_atomic(path, buf.getvalue())


def fetch_speech(
    item: SeedTTSItem, cfg: ServeConfig, wav_path: Path, cancellation: Cancellation | None = None
) -> RequestRow:
    """One streamed request; every failure mode becomes a row (table in the module docstring).

    With a `cancellation` that is cancelled, the request stops where it is and saves nothing.
    """
    row = RequestRow(utt=item.utt, status="ok")
    payload = json.dumps(request_body(item, cfg)).encode("utf-8")
    headers = {"Content-Type": "application/json", "Accept": "application/octet-stream"}
    if cfg.api_key:
        headers["Authorization"] = f"Bearer {cfg.api_key}"
    chunks: list[bytes] = []
    received = 0
    conn, path = _connection(cfg, cfg.timeout_s)
    if cancellation is not None:
        cancellation.register(conn)
    t0 = time.perf_counter()
    deadline = t0 + cfg.timeout_s
    try:
        try:
            if cancellation is not None and cancellation.cancelled:
                raise ConnectionAbortedError("cancelled before sending")
            conn.request("POST", path, body=payload, headers=headers)
            resp = conn.getresponse()
        except (ConnectionError, http.client.RemoteDisconnected, socket.gaierror, OSError) as exc:
            if isinstance(exc, TimeoutError):
                raise
            row.status, row.error = "connection_error", f"{type(exc).__name__}: {exc}"
            return row
        row.http_status = resp.status
        if resp.status != 200:
            detail = resp.read(2048).decode("utf-8", "replace").strip()
            row.status, row.error = "http_error", f"HTTP {resp.status} {resp.reason}: {detail[:300]}"
            return row
        while True:
            chunk = resp.read1(65536)
            if not chunk:
                break
            if row.ttfp_s is None:
                row.ttfp_s = round(time.perf_counter() - t0, 4)
            chunks.append(chunk)
            received += len(chunk)
            if time.perf_counter() > deadline:
                raise TimeoutError(f"request exceeded its {cfg.timeout_s:.1f} s deadline")
    except TimeoutError as exc:
        row.status, row.error = "timeout", f"{exc or 'read timed out'} after {received} bytes"
        row.bytes = received
        return row
    except http.client.IncompleteRead as exc:
        row.status, row.error = "truncated", f"body ended early after {received + len(exc.partial)} bytes: {exc}"
        row.bytes = received + len(exc.partial)
        return row
    except (ConnectionError, http.client.HTTPException, OSError) as exc:
        row.status = "truncated" if received else "connection_error"
        row.error = f"{type(exc).__name__}: {exc} after {received} bytes"
        row.bytes = received
        return row
    finally:
        if cancellation is not None:
            cancellation.unregister(conn)
        conn.close()
    row.e2e_s = round(time.perf_counter() - t0, 4)
    row.bytes = received
    row.content_type = resp.getheader("Content-Type") or ""
    declared = resp.getheader("Content-Length")
    if declared is not None and declared.strip().isdigit() and received < int(declared):
        # http.client's read1 returns b"" when the peer closes early instead of raising IncompleteRead.
        row.status, row.error = "truncated", f"body ended after {received} of {declared} bytes (Content-Length)"
        return row
    verdict = check_speech_body(b"".join(chunks), resp.getheader("Content-Type"), cfg.sample_rate)
    if verdict.status != "ok":
        row.status, row.error, row.body_head = verdict.status, verdict.error, verdict.head
        row.ttfp_s = row.e2e_s = None  # timings of a body that is not audio must not look like latencies
        return row
    if cancellation is not None and cancellation.cancelled:
        row.status, row.error = "connection_error", "cancelled (Ctrl-C) before the audio was saved"
        return row
    row.audio_s = round(len(verdict.pcm) / 2 / cfg.sample_rate, 4)
    row.rtf = round(row.e2e_s / row.audio_s, 4)
    save_pcm_wav(verdict.pcm, cfg.sample_rate, wav_path)
    row.wav = str(wav_path)
    return row


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "median": None, "p90": None, "max": None}
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return {
        "mean": round(statistics.fmean(values), 4),
        "median": round(statistics.median(values), 4),
        "p90": round(p90, 4),
        "max": round(ordered[-1], 4),
    }


def summarize_requests(rows: Mapping[str, Mapping[str, Any]], expected: list[str]) -> dict[str, Any]:
    counts = {s: 0 for s in REQUEST_STATUSES}
    counts["not_attempted"] = 0
    for utt in expected:
        row = rows.get(utt)
        key = "not_attempted" if row is None else str(row["status"])
        counts[key] = counts.get(key, 0) + 1
    ok = [rows[u] for u in expected if u in rows and rows[u]["status"] == "ok"]
    return {
        "counts": counts,
        "ttfp_s": _stats([float(r["ttfp_s"]) for r in ok if r.get("ttfp_s") is not None]),
        "e2e_s": _stats([float(r["e2e_s"]) for r in ok if r.get("e2e_s") is not None]),
        "rtf": _stats([float(r["rtf"]) for r in ok if r.get("rtf") is not None]),
        "audio_s_total": round(sum(float(r.get("audio_s") or 0.0) for r in ok), 3),
    }


def run_requests(
    dataset: SeedTTSDataset, cfg: ServeConfig, out_dir: str | Path, *, resume: bool = False, progress: bool = False
) -> dict[str, dict[str, Any]]:
    """Request every item not already fetched ok (with `resume`); return all rows by utterance.

    Ctrl-C stops the requests in flight (nothing more is saved) and raises `RequestsInterrupted`
    carrying the rows completed so far.
    """
    out = Path(out_dir)
    audio_dir = out / AUDIO_DIR
    audio_dir.mkdir(parents=True, exist_ok=True)
    missing = dataset.missing_prompt_wavs()
    if missing:
        raise FileNotFoundError(
            f"{dataset.meta_path}: {len(missing)} prompt wav(s) missing, first {missing[0].prompt_wav} "
            f"(line {missing[0].line_no}); serve mode sends every prompt as ref_audio"
        )
    log_path = out / REQUESTS_FILE
    wanted = {item.utt for item in dataset.items}
    rows = {k: v for k, v in read_jsonl_rows(log_path).items() if k in wanted} if resume else {}
    done = {u for u, r in rows.items() if r.get("status") == "ok" and (audio_dir / f"{u}.wav").is_file()}
    todo = [item for item in dataset.items if item.utt not in done]
    for item in todo:
        # A stale file from an earlier run must not be scored as this run's output.
        (audio_dir / f"{item.utt}.wav").unlink(missing_ok=True)
    cancellation = Cancellation()
    futures: dict[Future[RequestRow], SeedTTSItem] = {}
    pool = ThreadPoolExecutor(max_workers=cfg.max_concurrency, thread_name_prefix="seed-tts-req")
    bar = progress_bar(len(dataset), "requests", "req", initial=len(done), enabled=progress)
    try:
        with JsonlLog(log_path, resume=resume) as log:
            futures = {
                pool.submit(fetch_speech, item, cfg, audio_dir / f"{item.utt}.wav", cancellation): item for item in todo
            }
            pending = set(futures)
            while pending:
                # A bounded wait keeps the main thread responsive to Ctrl-C.
                finished, pending = wait(pending, timeout=_POLL_S, return_when=FIRST_COMPLETED)
                for fut in finished:
                    item = futures[fut]
                    try:
                        row = asdict(fut.result())
                    except Exception as exc:  # a driver bug on one item is recorded, not fatal
                        logger.exception("request for %s failed unexpectedly", item.utt)
                        row = asdict(
                            RequestRow(utt=item.utt, status="connection_error", error=f"{type(exc).__name__}: {exc}")
                        )
                    rows[item.utt] = row
                    log.append(row)
                    bar.update(1)
                    if row["status"] != "ok":
                        bar.write(f"{item.utt}: {row['status']} ({row['error']})")
    except KeyboardInterrupt as exc:
        # Stop what is in flight: queued requests are dropped, open connections shut down, nothing saved.
        cancellation.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
        wait(futures, timeout=_CANCEL_WAIT_S)  # a request stuck in connect() ends at its timeout, unsaved
        raise RequestsInterrupted(rows) from exc
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        bar.close()
    return rows


def serve_and_score(
    dataset: SeedTTSDataset,
    cfg: ServeConfig,
    out_dir: str | Path,
    asr_factory: Callable[[], ASRBackend] | None,
    *,
    resume: bool = False,
    progress: bool = False,
    histogram: bool = False,
) -> dict[str, Any]:
    """Requests, then (unless `asr_factory` is None) scoring of the received audio; returns the summary.

    `elapsed_s` of the summary covers both phases; `requests_elapsed_s` is the request phase alone.
    """
    from vllm_omni_token2wav.benchmarks.seed_tts.evaluate import SUMMARY_FILE, score_generated
    from vllm_omni_token2wav.benchmarks.seed_tts.results import write_json_atomic

    out = Path(out_dir)
    start = time.perf_counter()
    expected = [item.utt for item in dataset.items]

    def request_summary(rows: Mapping[str, Mapping[str, Any]], interrupted: bool) -> dict[str, Any]:
        elapsed = round(time.perf_counter() - start, 3)
        return {
            "meta": str(dataset.meta_path),
            "locale": dataset.locale,
            "scored": False,
            "interrupted": interrupted,
            "elapsed_s": elapsed,
            "requests_elapsed_s": elapsed,
            "requests": summarize_requests(rows, expected),
            "server": {"base_url": cfg.base_url, "model": cfg.model, "max_concurrency": cfg.max_concurrency},
        }

    try:
        rows = run_requests(dataset, cfg, out, resume=resume, progress=progress)
    except RequestsInterrupted as exc:
        write_json_atomic(out / SUMMARY_FILE, request_summary(exc.rows, interrupted=True))
        raise
    summary = request_summary(rows, interrupted=False)
    if asr_factory is None:
        write_json_atomic(out / SUMMARY_FILE, summary)
        return summary
    extra = {k: summary[k] for k in ("requests", "server", "requests_elapsed_s")}
    report = score_generated(
        dataset,
        out / AUDIO_DIR,
        asr_factory(),
        out,
        resume=resume,
        progress=progress,
        histogram=histogram,
        extra_summary=extra,
        started_at=start,
    )
    return report.summary
