# SPDX-License-Identifier: Apache-2.0
"""Crash-safe result files for long Seed-TTS runs: an append-only JSONL log and atomic JSON summaries.

A full English run is ~1100 utterances and an hour of ASR on a CPU host; losing it to a Ctrl-C or a killed
job is the common failure. Each finished utterance is appended as one complete line (a single `write` of a
newline-terminated JSON object, flushed and fsynced), so an interruption can at worst leave one torn last
line. `JsonlLog.open` drops such a torn tail before appending, and readers ignore it, which keeps the file
consistent. Later rows for the same utterance supersede earlier ones (a resumed run retries failures).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_omni_token2wav import atomic_io
from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)


class ResultLogError(ValueError):
    """A result log that cannot be resumed from: a malformed line before the last one (edited or corrupted)."""


def read_jsonl_rows(path: str | Path, key: str = "utt") -> dict[str, dict[str, Any]]:
    """Rows of a JSONL log by `key`, the last row per key winning. A torn final line is ignored.

    A malformed line that is NOT the last one means the file was edited or corrupted: raise
    `ResultLogError`, naming the line.
    """
    p = Path(path)
    if not p.exists():
        return {}
    rows: dict[str, dict[str, Any]] = {}
    data = p.read_bytes()
    lines = data.split(b"\n")
    complete = lines[:-1]  # the part after the last newline is either empty or a torn row
    for line_no, raw in enumerate(complete, start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ResultLogError(f"{p}:{line_no}: not a JSON row ({exc}); the result log is corrupted") from exc
        if not isinstance(row, dict) or key not in row:
            raise ResultLogError(f"{p}:{line_no}: row without {key!r} field; the result log is corrupted")
        rows[str(row[key])] = row
    if lines[-1].strip():
        logger.warning("%s: ignoring a torn last line (%d bytes) left by an interrupted run", p, len(lines[-1]))
    return rows


class JsonlLog:
    """Append-only JSONL writer; thread-safe, one fsynced line per row."""

    def __init__(self, path: str | Path, *, resume: bool) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        if resume and self.path.exists():
            self._drop_torn_tail()
            self._fh = self.path.open("ab")
        else:
            self._fh = self.path.open("wb")

    def _drop_torn_tail(self) -> None:
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end != len(data):
            with self.path.open("r+b") as fh:
                fh.truncate(end)

    def append(self, row: Mapping[str, Any]) -> None:
        line = (json.dumps(dict(row), ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8")
        with self._lock:
            self._fh.write(line)
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.close()

    def __enter__(self) -> JsonlLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write JSON so readers see the old file or the new one, never a partial one (tmp file + os.replace)."""
    atomic_io.write_json_atomic(path, obj, fsync=True)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    atomic_io.write_bytes_atomic(path, data, fsync=True)
