# SPDX-License-Identifier: Apache-2.0
"""What identifies a weights file for the caches that outlive a read of it, without hashing it every time.

The torch CAM++ process cache and the on-disk TensorRT engine cache must not serve a model built
from an older version of `campplus.onnx`. The file's size, mtime and inode alone miss an in-place
rewrite of the same size whose mtime was put back (`cp --preserve`, `rsync -t`, restoring a backup),
so the identity carries the SHA-256 of the content. Hashing the 28 MB `campplus.onnx` costs ~45 ms
on the 2-core build host (sha256 with SHA-NI, 1 MiB blocks), which made every process-cache hit cost
18-22 ms.

The digest is therefore remembered per file and reused while the file's full stat identity is
unchanged: device, inode, size, mtime and **ctime**. The kernel sets ctime to the current time on every
write, truncate, rename onto the path or `utime` call, and no user-level call can set it back, so a
rewrite whose mtime was restored still changes ctime and is hashed again; a file replaced by a rename
has another inode. One gap remains, the one git calls "racily clean": ctime comes from a coarse clock
(one kernel tick, 1-10 ms; whole seconds on some file systems), so a rewrite within the same tick as
the write the digest was taken after would keep the same ctime. A remembered digest is therefore only
trusted when the file's ctime was at least `RACY_WINDOW_NS` older than the moment hashing started;
until then every lookup hashes again (a file that was just written pays the hash, as before).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_BLOCK = 1 << 20

#: How much older than the start of hashing a file's ctime must be for its digest to be reused:
#: above the coarsest timestamp granularity of the file systems we serve from (2 s: FAT/exFAT mtime;
#: ext4/xfs/btrfs/overlayfs keep ns but update from a clock that advances once per kernel tick).
RACY_WINDOW_NS = 2_000_000_000


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of the file's content, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class _Stat:
    """The part of `os.stat` that changes whenever the content can have changed."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> _Stat:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True)
class _Remembered:
    stat: _Stat
    sha256: str
    trusted: bool  # ctime was RACY_WINDOW_NS older than the start of hashing


@dataclass
class DigestMemoStats:
    """How `FileIdentity.of` got its digests (tests and benchmarks read it)."""

    hashed: int = 0
    reused: int = 0


_memo_lock = threading.Lock()
_memo: dict[str, _Remembered] = {}
memo_stats = DigestMemoStats()


def _digest(path: Path, identity: _Stat) -> str:
    """The content digest of `path` whose stat is `identity`: remembered when trusted, else hashed now."""
    key = str(path)
    with _memo_lock:
        remembered = _memo.get(key)
        if remembered is not None and remembered.trusted and remembered.stat == identity:
            memo_stats.reused += 1
            return remembered.sha256
    started = time.time_ns()
    sha = file_sha256(path)
    after = _Stat.of(path.stat())
    with _memo_lock:
        memo_stats.hashed += 1
        if after == identity:  # not written while it was read: the digest belongs to this stat identity
            _memo[key] = _Remembered(identity, sha, trusted=started - identity.ctime_ns >= RACY_WINDOW_NS)
        else:
            _memo.pop(key, None)
    return sha


def clear_digest_memo() -> None:
    """Forget every remembered digest (tests; the next lookup of each file hashes it)."""
    with _memo_lock:
        _memo.clear()
        memo_stats.hashed = memo_stats.reused = 0


@dataclass(frozen=True)
class FileIdentity:
    """A file as caches key it: resolved path, stat identity and content digest."""

    path: str
    size: int
    mtime_ns: int
    inode: int
    sha256: str

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> FileIdentity:
        """Stat `path` (resolved) and get its digest; raises FileNotFoundError / IsADirectoryError like `open()`.

        The digest is hashed only when the file's stat identity changed since it was last hashed, or the
        file is too recently changed to tell (module docstring).
        """
        resolved = Path(path).expanduser().resolve()
        st = resolved.stat()
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(resolved))
        identity = _Stat.of(st)
        return cls(str(resolved), identity.size, identity.mtime_ns, identity.inode, _digest(resolved, identity))


__all__ = ["RACY_WINDOW_NS", "DigestMemoStats", "FileIdentity", "clear_digest_memo", "file_sha256", "memo_stats"]
