# SPDX-License-Identifier: Apache-2.0
"""Atomic file writes: a reader sees the old file or the new one, never a partial one.

Reports, result summaries, generated stand-in assets and TensorRT engines are all written the same
way: into a temporary file in the target's folder (same file system, so `os.replace` is atomic),
then renamed over the target; on any failure, including Ctrl-C, the temporary file is removed.

Two properties a plain `open(path, "w")` has and a naive tmp + rename does not:

- **Permissions.** The written file gets the mode `open()` would give it: a new file `0o666` minus
  the process umask (the kernel applies it, exactly as for `open()`), a replaced file keeps the
  permission bits it had. (`tempfile.mkstemp` would make every file `0o600`.)
- **Leftovers.** A process killed between creating the temporary file and the rename (`kill -9`,
  OOM, power loss) cannot clean up. Temporary files are therefore named
  `.<target name>.<host>-<pid>-<random>.tmp<target suffix>` (`host`: 8 hex digits of the host
  name's hash). The next write of the same target removes every such file whose writer process on
  this host no longer exists; files of live writers and of other hosts (shared folders) are left
  alone. Any file matching that pattern whose writer is gone is safe to delete by hand.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

_NEW_FILE_MODE = 0o666  # what open() asks for; the kernel removes the umask bits
_TAG = re.compile(r"(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]+)-[0-9a-z]+")


def _host_tag() -> str:
    return hashlib.sha1(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]


def _tmp_affixes(target: Path) -> tuple[str, str]:
    """(prefix, suffix) of every temporary file of `target`; the writer tag goes between them."""
    return f".{target.name}.", f".tmp{target.suffix}"


def _writer_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # another thread of this process is writing the same target right now
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    except OSError:
        return True  # cannot tell: keep the file
    return True


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Delete the temporary files of `path` left by writers on this host that no longer run; return them."""
    target = Path(path)
    prefix, suffix = _tmp_affixes(target)
    host = _host_tag()
    removed: list[Path] = []
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not (name.startswith(prefix) and name.endswith(suffix)) or len(name) <= len(prefix) + len(suffix):
            continue
        tag = _TAG.fullmatch(name[len(prefix) : len(name) - len(suffix)])
        if tag is None or tag["host"] != host or _writer_alive(int(tag["pid"])):
            continue
        stale = Path(entry.path)
        try:
            stale.unlink()
        except FileNotFoundError:
            continue  # another writer cleaned it first
        except OSError as exc:
            logger.warning("could not remove stale temporary file %s: %s", stale, exc)
            continue
        removed.append(stale)
    if removed:
        logger.info("removed %d stale temporary file(s) of %s left by killed writers", len(removed), target)
    return removed


def _create_temporary(target: Path) -> Path:
    """Create (O_EXCL) an empty temporary file for `target` with the mode `open()` would give the target."""
    prefix, suffix = _tmp_affixes(target)
    tag = f"{_host_tag()}-{os.getpid()}"
    try:
        keep_mode: int | None = stat.S_IMODE(target.stat().st_mode) & 0o777
    except FileNotFoundError:
        keep_mode = None
    for _ in range(100):
        tmp = target.parent / f"{prefix}{tag}-{secrets.token_hex(4)}{suffix}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), _NEW_FILE_MODE)
        except FileExistsError:
            continue
        try:
            if keep_mode is not None:
                os.fchmod(fd, keep_mode)  # replacing a file keeps its permissions, like open(path, "w")
        finally:
            os.close(fd)
        return tmp
    raise FileExistsError(errno.EEXIST, f"no free temporary file name next to {target}")


@contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to `path` (same suffix, so writers that infer the format from it
    work); on a clean exit it replaces `path`, on an exception it is deleted. Creates the folder and
    first removes temporaries of `path` that killed writers left behind (module docstring)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, f"{target} is a folder; give a file name", str(target))
    remove_stale_temporaries(target)
    tmp = _create_temporary(target)
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
