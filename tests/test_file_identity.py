# SPDX-License-Identifier: Apache-2.0
"""A file's identity for caches: a same-size in-place rewrite with the mtime put back still changes it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from vllm_omni_token2wav.file_identity import FileIdentity, file_sha256

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def test_digest_is_the_sha256_of_the_content(tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    data = os.urandom(3 << 20) + b"tail"  # several read blocks
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()


def test_an_in_place_rewrite_with_the_mtime_restored_changes_the_identity(tmp_path: Path) -> None:
    path = tmp_path / "campplus.onnx"
    path.write_bytes(b"A" * 4096)
    first = FileIdentity.of(path)
    assert FileIdentity.of(path) == first
    st = path.stat()
    with path.open("r+b") as handle:
        handle.write(b"B" * 4096)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    second = FileIdentity.of(path)
    assert (second.size, second.mtime_ns, second.inode) == (first.size, first.mtime_ns, first.inode)
    assert second != first and second.sha256 == hashlib.sha256(b"B" * 4096).hexdigest()


def test_the_path_is_resolved(tmp_path: Path) -> None:
    (tmp_path / "real.onnx").write_bytes(b"x")
    os.symlink(tmp_path / "real.onnx", tmp_path / "link.onnx")
    assert FileIdentity.of(tmp_path / "link.onnx").path == str((tmp_path / "real.onnx").resolve())
