#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fail when a source file lacks an `SPDX-License-Identifier:` line in its first lines.

Usage: check_spdx.py FILE... (pre-commit passes the staged files; with no files it checks the repo).
Python and shell sources are checked; the header must appear within the first 3 lines so a
shebang or an encoding line may precede it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

MARKER = "SPDX-License-Identifier:"
HEAD_LINES = 3
SUFFIXES = (".py", ".sh")


def is_source(path: Path) -> bool:
    if path.suffix in SUFFIXES:
        return True
    if path.suffix:
        return False
    try:
        first = path.read_text(encoding="utf-8", errors="replace").split("\n", 1)[0]
    except OSError:
        return False
    return first.startswith("#!") and ("python" in first or "sh" in first)


def has_header(path: Path) -> bool:
    with path.open(encoding="utf-8", errors="replace") as handle:
        for _ in range(HEAD_LINES):
            line = handle.readline()
            if not line:
                break
            if MARKER in line:
                return True
    return False


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], check=True, capture_output=True, text=True).stdout
    return [Path(p) for p in out.splitlines()]


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] if argv else tracked_files()
    bad = [p for p in paths if p.is_file() and is_source(p) and not has_header(p)]
    for path in bad:
        print(f"{path}: missing '{MARKER} Apache-2.0' in the first {HEAD_LINES} lines", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
