# SPDX-License-Identifier: Apache-2.0
"""Atomic file writes: a reader sees the old file or the new one, never a partial one.

Reports, result summaries, generated stand-in assets and TensorRT engines are all written the same
way: into a temporary file in the target's folder (same file system, so `os.replace` is atomic),
then renamed over the target; on any failure, including Ctrl-C, the temporary file is removed.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to `path` (same suffix, so writers that infer the format from it
    work); on a clean exit it replaces `path`, on an exception it is deleted. Creates the folder."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=f".tmp{target.suffix}", dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: str | Path, data: bytes, *, fsync: bool = False) -> None:
    """Write `data` to `path` atomically; `fsync=True` also flushes it to disk before the rename."""
    with atomic_output(path) as tmp, tmp.open("wb") as handle:
        handle.write(data)
        if fsync:
            handle.flush()
            os.fsync(handle.fileno())


def write_json_atomic(path: str | Path, obj: Any, *, fsync: bool = False) -> None:
    """Write `obj` as indented, key-sorted UTF-8 JSON atomically."""
    text = json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=True) + "\n"
    write_bytes_atomic(path, text.encode("utf-8"), fsync=fsync)
