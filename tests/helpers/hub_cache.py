# SPDX-License-Identifier: Apache-2.0
"""An offline Hugging Face hub cache laid out the standard way, built from local folders (no network).

huggingface_hub's cache for a model repo `org/name` under `HF_HUB_CACHE`:

    models--org--name/refs/<branch or tag>      the commit hash it points at (no newline)
    models--org--name/snapshots/<hash>/<files>  the repo's files at that commit
    models--org--name/blobs/<etag>              the file contents, when snapshots hold symlinks to them

`add_snapshot` writes one commit: its files hard-linked (copied across file systems) into the snapshot
folder, or with `blobs=True` stored once under `blobs/` and symlinked from the snapshot as the hub's
downloads do. `snapshot_download(repo_id, local_files_only=True)` (or under `HF_HUB_OFFLINE=1`) then
returns the snapshot folder without any network.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path


def repo_folder(cache: Path, repo_id: str) -> Path:
    return cache / f"models--{repo_id.replace('/', '--')}"


def commit_hash(label: str) -> str:
    """A 40-hex commit hash derived from `label` (deterministic, distinct per label)."""
    return hashlib.sha1(label.encode()).hexdigest()


def _link_or_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def folder_files(folder: Path, *, move: Mapping[str, str] | None = None, skip: Iterable[str] = ()) -> dict[str, Path]:
    """`{repo path: file}` of every visible file under `folder`; `move` relocates path prefixes (`"token2wav/": ""`)."""
    skipped = tuple(skip)
    out: dict[str, Path] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if not path.is_file() or any(part.startswith(".") for part in rel.split("/")) or rel.startswith(skipped):
            continue
        for old, new in (move or {}).items():
            if rel.startswith(old):
                rel = new + rel[len(old) :]
                break
        out[rel] = path
    return out


def add_snapshot(
    cache: Path,
    repo_id: str,
    files: Mapping[str, Path],
    *,
    revision: str,
    refs: Iterable[str] = ("main",),
    blobs: bool = False,
) -> Path:
    """Write commit `revision` of `repo_id` holding `files` ({repo path: source file}); point `refs` at it."""
    repo = repo_folder(cache, repo_id)
    snapshot = repo / "snapshots" / revision
    for rel, source in files.items():
        target = snapshot / rel
        if blobs:
            blob = repo / "blobs" / hashlib.sha256(source.read_bytes()).hexdigest()
            if not blob.exists():
                _link_or_copy(source, blob)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(os.path.relpath(blob, target.parent))
        else:
            _link_or_copy(source, target)
    for ref in refs:
        ref_file = repo / "refs" / ref
        ref_file.parent.mkdir(parents=True, exist_ok=True)
        ref_file.write_text(revision)
    return snapshot


__all__ = ["add_snapshot", "commit_hash", "folder_files", "repo_folder"]
