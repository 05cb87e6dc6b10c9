# SPDX-License-Identifier: Apache-2.0
"""Say which weights file a report or a log line is about: an official asset, one of our stand-ins, or neither.

Our CI and every benchmark on a build host run on deterministic stand-ins (real weights cannot be
downloaded there); a number measured on a stand-in must never read as a number about the real model,
and a user's file that is neither must not pass for either. Every report and load log therefore
labels a weights file through `identify_file`:

| label                                | when                                                                   |
|--------------------------------------|------------------------------------------------------------------------|
| the asset's `label` (`KNOWN_FILES`)  | size and SHA-256 equal an official asset's (public download manifests) |
| `"stand-in"`                         | a file our stand-in generators wrote (their digests are registered)     |
| `"unknown file"`                     | anything else                                                          |

`KNOWN_FILES` is the one table of official digests. Stand-in generators call `record_standin` with each
file they produce (or find in their cache); the registry is `standins/registry.json` in the project
cache, keyed by SHA-256, so a stand-in copied into a model folder is still recognised. Digests come from
`file_identity` (remembered while a file's stat identity is unchanged), and a file whose size matches
neither an official asset nor a registered stand-in is labelled without being hashed.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from vllm_omni_token2wav import envs
from vllm_omni_token2wav.atomic_io import write_json_atomic
from vllm_omni_token2wav.file_identity import FileIdentity

FileKind = Literal["official", "stand-in", "unknown"]

STANDIN_LABEL: Final = "stand-in"
UNKNOWN_LABEL: Final = "unknown file"


@dataclass(frozen=True)
class KnownFile:
    """An official asset, identified by size and content digest."""

    label: str  # what reports and logs call it
    name: str  # its file name in the official model folders
    size: int
    sha256: str
    source: str  # where the digest was published


#: Official assets we can recognise by content. Add a row per asset; nothing else in the package keeps digests.
KNOWN_FILES: Final[tuple[KnownFile, ...]] = (
    KnownFile(
        label="official CosyVoice campplus.onnx",
        name="campplus.onnx",
        size=28_303_423,
        sha256="a6ac6a63997761ae2997373e2ee1c47040854b4b759ea41ec48e4e42df0f4d73",
        source="public download manifests of the CosyVoice / Step-Audio2 / MiniCPM-o model repositories",
    ),
)


def official_file(name: str) -> KnownFile:
    """The `KNOWN_FILES` row of the official asset called `name`; KeyError names the known ones."""
    for known in KNOWN_FILES:
        if known.name == name:
            return known
    raise KeyError(f"no official asset named {name!r}; known: {sorted(k.name for k in KNOWN_FILES)}")


@dataclass(frozen=True)
class FileOrigin:
    """What `identify_file` found: the label to print and what it rests on."""

    path: str
    kind: FileKind
    label: str
    size: int
    sha256: str | None  # None when the size alone ruled out every known and stand-in file
    detail: str = ""  # the official asset's source, or the stand-in's recipe

    def describe(self) -> str:
        """`<label> (sha256 <first 12>...)`, for one log line."""
        digest = f"sha256 {self.sha256[:12]}..." if self.sha256 else f"{self.size} bytes"
        return f"{self.label} ({digest})"


_registry_lock = threading.Lock()


def _registry_path() -> Path:
    return envs.cache_dir("standins") / "registry.json"


def _read_registry(path: Path) -> dict[str, dict[str, object]]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {}  # a damaged registry only costs the "stand-in" label until the next generator run rewrites it
    return data if isinstance(data, dict) else {}


def record_standin(path: str | os.PathLike[str], recipe: str) -> None:
    """Register `path` (a file a stand-in generator wrote) as a stand-in; `recipe` says how it was made."""
    identity = FileIdentity.of(path)
    registry_file = _registry_path()
    entry = {"size": identity.size, "recipe": recipe}
    with _registry_lock:
        from filelock import FileLock  # a torch dependency: always installed alongside torch

        with FileLock(str(registry_file) + ".lock"):
            registry = _read_registry(registry_file)
            if registry.get(identity.sha256) == entry:
                return
            registry[identity.sha256] = entry
            write_json_atomic(registry_file, registry)


def identify_file(path: str | os.PathLike[str]) -> FileOrigin:
    """Label `path` as an official asset, a stand-in of ours, or an unknown file (module docstring)."""
    resolved = Path(path).expanduser().resolve()
    size = resolved.stat().st_size
    registry = _read_registry(_registry_path())
    standin_sizes = {entry.get("size") for entry in registry.values() if isinstance(entry, dict)}
    if size not in {known.size for known in KNOWN_FILES} and size not in standin_sizes:
        return FileOrigin(str(resolved), "unknown", UNKNOWN_LABEL, size, None)
    sha = FileIdentity.of(resolved).sha256
    for known in KNOWN_FILES:
        if (known.size, known.sha256) == (size, sha):
            return FileOrigin(str(resolved), "official", known.label, size, sha, known.source)
    entry = registry.get(sha)
    if isinstance(entry, dict) and entry.get("size") == size:
        return FileOrigin(str(resolved), "stand-in", STANDIN_LABEL, size, sha, str(entry.get("recipe", "")))
    return FileOrigin(str(resolved), "unknown", UNKNOWN_LABEL, size, sha)


__all__ = [
    "KNOWN_FILES",
    "STANDIN_LABEL",
    "UNKNOWN_LABEL",
    "FileKind",
    "FileOrigin",
    "KnownFile",
    "identify_file",
    "official_file",
    "record_standin",
]
