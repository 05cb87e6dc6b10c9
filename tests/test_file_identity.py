# SPDX-License-Identifier: Apache-2.0
"""A file's identity for caches: a same-size in-place rewrite with the mtime put back still changes it."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_omni_token2wav import file_identity
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


@pytest.fixture
def memo(monkeypatch: pytest.MonkeyPatch) -> Iterator[file_identity.DigestMemoStats]:
    """A fresh digest memo whose digests are trusted at once (no racy window): what a long-lived file gets."""
    file_identity.clear_digest_memo()
    monkeypatch.setattr(file_identity, "RACY_WINDOW_NS", 0)
    yield file_identity.memo_stats
    file_identity.clear_digest_memo()


def _rewrite_in_place_keeping_mtime(path: Path, data: bytes) -> None:
    st = path.stat()
    time.sleep(0.05)  # past the coarse clock tick ctime comes from (1-10 ms)
    with path.open("r+b") as handle:
        handle.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    assert after.st_ctime_ns != st.st_ctime_ns, "this file system did not move ctime: the check below means nothing"


def test_an_unchanged_file_is_hashed_once_and_its_digest_reused(
    tmp_path: Path, memo: file_identity.DigestMemoStats
) -> None:
    path = tmp_path / "campplus.onnx"
    path.write_bytes(os.urandom(1 << 20))
    first = FileIdentity.of(path)
    assert [FileIdentity.of(path) for _ in range(5)] == [first] * 5
    assert (memo.hashed, memo.reused) == (1, 5)


def test_a_rewrite_with_the_mtime_restored_is_hashed_again_after_a_reused_digest(
    tmp_path: Path, memo: file_identity.DigestMemoStats
) -> None:
    path = tmp_path / "campplus.onnx"
    path.write_bytes(b"A" * 4096)
    first = FileIdentity.of(path)
    assert FileIdentity.of(path) == first and memo.reused == 1
    _rewrite_in_place_keeping_mtime(path, b"B" * 4096)
    second = FileIdentity.of(path)
    assert second.sha256 == hashlib.sha256(b"B" * 4096).hexdigest() and second != first
    assert memo.hashed == 2


def test_a_file_replaced_by_a_rename_with_the_same_size_and_mtime_is_hashed_again(
    tmp_path: Path, memo: file_identity.DigestMemoStats
) -> None:
    path, other = tmp_path / "campplus.onnx", tmp_path / "new.onnx"
    path.write_bytes(b"A" * 4096)
    other.write_bytes(b"C" * 4096)
    st = path.stat()
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    first = FileIdentity.of(path)
    os.replace(other, path)
    second = FileIdentity.of(path)
    assert second.sha256 == hashlib.sha256(b"C" * 4096).hexdigest() and second.inode != first.inode
    assert memo.hashed == 2


def test_a_file_changed_within_the_racy_window_is_hashed_on_every_lookup(tmp_path: Path) -> None:
    """A digest taken within RACY_WINDOW_NS of the file's last change is not reused (a same-tick rewrite)."""
    file_identity.clear_digest_memo()
    path = tmp_path / "campplus.onnx"
    path.write_bytes(b"A" * 4096)
    for _ in range(3):
        FileIdentity.of(path)
    assert (file_identity.memo_stats.hashed, file_identity.memo_stats.reused) == (3, 0)
    file_identity.clear_digest_memo()


def test_a_directory_is_refused_like_open_refuses_it(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        FileIdentity.of(tmp_path)
