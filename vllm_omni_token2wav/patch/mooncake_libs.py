# SPDX-License-Identifier: Apache-2.0
"""Load the system libraries Mooncake's transfer engine links against from a folder, for hosts without root.

`mooncake-transfer-engine-non-cuda` (the `multinode` extra) links `libibverbs.so.1`, which needs `libnl-3.so.200`
and `libnl-route-3.so.200` (Debian packages `libibverbs1 libnl-3-200 libnl-route-3-200`). Where they cannot be
installed system-wide (CI, a container without root), `tools/fetch_multinode_libs.sh` unpacks those packages into
a folder; the default is `<venv>/lib/token2wav-system-libs`, which `tools/dev_setup.sh` fills. `preload()`, called
by the Mooncake patches before anything imports `mooncake.engine`, loads the three libraries from that folder
(or `$VLLM_OMNI_TOKEN2WAV_SYSTEM_LIBS`) with global symbols, so the dynamic loader finds them by soname when
`mooncake`'s extension loads, in this process and without `LD_LIBRARY_PATH`. Where the folder does not exist it
does nothing (the system's libraries are used, or `mooncake` reports the missing one on import).
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

__all__ = ["DEBIAN_PACKAGES", "ENV", "LIBRARIES", "default_folder", "library_dirs", "preload"]

ENV = "VLLM_OMNI_TOKEN2WAV_SYSTEM_LIBS"
#: The Debian packages that provide the libraries (bookworm: libibverbs1 44.0, libnl 3.7.0).
DEBIAN_PACKAGES = ("libibverbs1", "libnl-3-200", "libnl-route-3-200")
#: Load order: each after the libraries it needs.
LIBRARIES = ("libnl-3.so.200", "libnl-route-3.so.200", "libibverbs.so.1")
_loaded: list[str] = []


def default_folder() -> Path:
    """`$VLLM_OMNI_TOKEN2WAV_SYSTEM_LIBS`, else `<sys.prefix>/lib/token2wav-system-libs`."""
    return Path(os.environ.get(ENV) or Path(sys.prefix) / "lib" / "token2wav-system-libs")


def library_dirs(folder: Path) -> list[Path]:
    """The folders under `folder` (the unpacked packages' `usr/lib/...`, `lib/...`) that hold a `.so` file."""
    if not folder.is_dir():
        return []
    return sorted({p.parent for p in folder.rglob("*.so*") if p.is_file() or p.is_symlink()})


def preload(folder: Path | None = None) -> list[str]:
    """Load `LIBRARIES` from `folder` (default `default_folder()`) once per process; the paths loaded."""
    if _loaded:
        return list(_loaded)
    dirs = library_dirs(folder or default_folder())
    for name in LIBRARIES:
        path = next((d / name for d in dirs if (d / name).exists()), None)
        if path is None:
            continue
        try:
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            logger.warning("could not load %s from %s: %s", name, path.parent, exc)
            continue
        _loaded.append(str(path))
    if _loaded:
        logger.debug("loaded Mooncake's system libraries: %s", ", ".join(_loaded))
    return list(_loaded)
