# SPDX-License-Identifier: Apache-2.0
"""Decide whether the body of a 200 speech response is the audio that was asked for.

The serve driver asks for raw s16le mono PCM at one rate. A server (or a proxy in front of it) may
instead answer 200 with a JSON or HTML error page, plain text, a WAV container, or a container cut
short. Taking such a body for PCM is a silent wrong result: a header read as samples gets scored
(WER 0.75 on noise), an error page becomes "audio" whose duration enters the RTF statistics. So
every body is classified before anything is saved or measured:

| body                                   | verdict                                                 |
|----------------------------------------|---------------------------------------------------------|
| JSON, HTML or text (any Content-Type)  | `bad_body`, the first bytes quoted                      |
| Content-Type JSON / text / other media | `bad_body` (e.g. `audio/mpeg` is not the requested pcm) |
| RIFF/WAVE container                    | parsed: 16-bit integer PCM, mono, the requested rate,   |
|                                        | else `bad_body`; data shorter than its header declares  |
|                                        | (or a cut header) is `truncated`; its samples are used  |
| raw PCM                                | a whole number of s16 samples (else `truncated`); rate  |
|                                        | and channels in the Content-Type (`audio/L16;rate=..`), |
|                                        | when given, must match the request                      |

A WAV whose data size is 0 or 0xFFFFFFFF (the placeholder streaming writers put before they know
the length) runs to the end of the body. Nothing here does I/O; `check_speech_body` is a pure
function of the bytes, the Content-Type header and the requested rate.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

STATUS_OK = "ok"
STATUS_BAD_BODY = "bad_body"
STATUS_TRUNCATED = "truncated"
STATUS_NO_AUDIO = "no_audio"

HEAD_BYTES = 64  # bytes of a rejected body quoted in its row

# Content-Types a raw s16le body may carry. audio/L16 is big-endian by RFC 2586, but servers use it
# loosely; its rate/channels parameters are checked, the byte order cannot be.
PCM_TYPES = frozenset({"audio/pcm", "audio/l16", "audio/x-pcm", "audio/raw", "audio/s16le", "application/octet-stream"})
WAV_TYPES = frozenset({"audio/wav", "audio/x-wav", "audio/wave", "audio/vnd.wave"})
_WAVE_PCM = 0x0001
_WAVE_EXTENSIBLE = 0xFFFE
_STREAMING_SIZES = (0, 0xFFFFFFFF)


@dataclass(frozen=True)
class BodyVerdict:
    """`pcm` holds the s16le mono samples when `status` is ok; otherwise `error` says what is wrong."""

    status: str
    pcm: bytes = b""
    error: str = ""
    container: str = ""  # "pcm" | "wav" | "json" | "html" | "text" | the media type
    head: str = ""  # repr of the first bytes of a rejected body


def quote_head(body: bytes, n: int = HEAD_BYTES) -> str:
    """The first `n` bytes as a Python bytes literal (what a row quotes), with `...` when cut."""
    text = repr(body[:n])
    return text + ("..." if len(body) > n else "")


def _media_type(content_type: str | None) -> tuple[str | None, dict[str, str]]:
    if content_type is None or not content_type.strip():
        return None, {}
    parts = [p.strip() for p in content_type.split(";")]
    params = {}
    for part in parts[1:]:
        key, _, value = part.partition("=")
        params[key.strip().lower()] = value.strip().strip('"')
    return parts[0].lower(), params


def _text_kind(body: bytes) -> str | None:
    """ "json", "html" or "text" when the body is readable text, else None (binary: maybe audio)."""
    start = body.lstrip()[:1]
    if start in (b"{", b"["):
        try:
            json.loads(body)
            return "json"
        except (ValueError, UnicodeDecodeError):
            pass
    if start == b"<" and body.lstrip()[:512].lower().startswith((b"<!doctype", b"<html", b"<?xml", b"<head", b"<body")):
        return "html"
    sample = body[:512]
    for cut in range(4):  # a multi-byte character may straddle the sample's end
        try:
            text = sample[: len(sample) - cut].decode("utf-8")
            break
        except UnicodeDecodeError:
            continue
    else:
        return None
    if text and all(ch.isprintable() or ch in "\t\r\n" for ch in text):
        # Speech PCM starts near silence: its bytes are mostly 0x00/0xff, never all printable.
        return "json" if start in (b"{", b"[") else "text"
    return None


def _bad(kind: str, body: bytes, why: str) -> BodyVerdict:
    head = quote_head(body)
    return BodyVerdict(STATUS_BAD_BODY, error=f"{why}; first bytes {head}", container=kind, head=head)


def _parse_wav(body: bytes, sample_rate: int) -> BodyVerdict:
    """Check a RIFF/WAVE container against the request and return its samples."""
    if len(body) < 12:
        return BodyVerdict(STATUS_TRUNCATED, error=f"WAV header cut after {len(body)} bytes", container="wav")
    fmt: tuple[int, int, int, int] | None = None
    pos = 12
    while True:
        if pos + 8 > len(body):
            what = "fmt chunk" if fmt is None else "data chunk"
            return BodyVerdict(
                STATUS_TRUNCATED, error=f"WAV body ended after {len(body)} bytes before its {what}", container="wav"
            )
        chunk_id, size = body[pos : pos + 4], struct.unpack_from("<I", body, pos + 4)[0]
        payload = pos + 8
        if chunk_id == b"fmt ":
            if payload + 16 > len(body):
                return BodyVerdict(STATUS_TRUNCATED, error="WAV fmt chunk cut short", container="wav")
            tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", body, payload)
            if tag == _WAVE_EXTENSIBLE and size >= 40 and payload + 26 <= len(body):
                tag = struct.unpack_from("<H", body, payload + 24)[0]  # the sub-format GUID starts with the tag
            fmt = (tag, channels, rate, bits)
        elif chunk_id == b"data":
            break
        pos = payload + size + (size & 1)  # chunks are word aligned
    if fmt is None:
        return _bad("wav", body, "WAV container without a fmt chunk before its data")
    tag, channels, rate, bits = fmt
    problems = []
    if tag != _WAVE_PCM or bits != 16:
        problems.append(f"{bits}-bit {'integer PCM' if tag == _WAVE_PCM else f'format 0x{tag:04x}'} samples")
    if channels != 1:
        problems.append(f"{channels} channels")
    if rate != sample_rate:
        problems.append(f"{rate} Hz")
    if problems:
        return _bad("wav", body, f"WAV of {', '.join(problems)}; requested 16-bit mono PCM at {sample_rate} Hz")
    available = len(body) - payload
    if size in _STREAMING_SIZES:
        size = available  # a streaming writer's placeholder: the data runs to the end of the body
    if available < size:
        return BodyVerdict(
            STATUS_TRUNCATED,
            error=f"WAV data ended after {available} of the {size} bytes its header declares",
            container="wav",
        )
    if size % 2:
        return BodyVerdict(
            STATUS_TRUNCATED, error=f"WAV data of {size} bytes is not a whole number of s16 samples", container="wav"
        )
    if size == 0:
        return BodyVerdict(STATUS_NO_AUDIO, error="WAV container without samples", container="wav")
    return BodyVerdict(STATUS_OK, pcm=body[payload : payload + size], container="wav")


def check_speech_body(body: bytes, content_type: str | None, sample_rate: int) -> BodyVerdict:
    """Classify a complete 200 body against a request for s16le mono PCM at `sample_rate` (table above)."""
    if not body:
        return BodyVerdict(STATUS_NO_AUDIO, error="200 with an empty body")
    media, params = _media_type(content_type)
    if body[:4] == b"RIFF" and (len(body) < 12 or body[8:12] == b"WAVE"):
        if media is not None and media not in WAV_TYPES | PCM_TYPES:
            return _bad("wav", body, f"Content-Type {content_type!r} with a WAV body")
        return _parse_wav(body, sample_rate)
    kind = _text_kind(body)
    if kind is not None:
        label = f" (Content-Type {content_type})" if content_type else ""
        return _bad(kind, body, f"{kind} body{label} instead of audio")
    if media in WAV_TYPES:
        return _bad("wav", body, f"Content-Type {content_type!r} but the body is not a RIFF/WAVE container")
    if media is not None and media not in PCM_TYPES:
        return _bad(media, body, f"Content-Type {content_type!r} is not the requested raw s16le PCM")
    if "rate" in params and params["rate"] != str(sample_rate):
        return _bad("pcm", body, f"Content-Type {content_type!r}: rate {params['rate']}, requested {sample_rate}")
    if params.get("channels", "1") != "1":
        return _bad("pcm", body, f"Content-Type {content_type!r}: {params['channels']} channels, requested mono")
    if len(body) % 2:
        return BodyVerdict(
            STATUS_TRUNCATED, error=f"{len(body)} bytes is not a whole number of s16 samples", container="pcm"
        )
    return BodyVerdict(STATUS_OK, pcm=body, container="pcm")


__all__ = [
    "HEAD_BYTES",
    "PCM_TYPES",
    "STATUS_BAD_BODY",
    "WAV_TYPES",
    "BodyVerdict",
    "check_speech_body",
    "quote_head",
]
