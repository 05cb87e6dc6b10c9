# SPDX-License-Identifier: Apache-2.0
"""What identifies a weights file for the caches that outlive a read of it.

The torch CAM++ process cache and the on-disk TensorRT engine cache must not serve a model built
from an older version of `campplus.onnx`. The file's stat identity (size, mtime, inode) alone
misses an in-place rewrite of the same size whose mtime was put back (`cp --preserve`, `rsync -t`,
restoring a backup), so the identity includes the SHA-256 of the content as well. Hashing costs
~45 ms for the 28 MB `campplus.onnx` on the 2-core build host (sha256 with SHA-NI; measured with
`hashlib` in 1 MiB blocks, load 7, median of 5), paid once per cache lookup, which happens when a
backend is built (facade set-up, `reload_spk_embedding()`), never per request.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

_BLOCK = 1 << 20


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of the file's content, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


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
        """Stat and hash `path` (resolved); raises FileNotFoundError / IsADirectoryError like `open()`."""
        resolved = Path(path).expanduser().resolve()
        st = resolved.stat()
        digest = file_sha256(resolved)
        return cls(str(resolved), st.st_size, st.st_mtime_ns, st.st_ino, digest)


__all__ = ["FileIdentity", "file_sha256"]
