# SPDX-License-Identifier: Apache-2.0
"""Progress reporting for the benchmarks: a bar on a terminal, plain periodic lines in a log.

A tqdm bar redraws itself with carriage returns; written to a file or a CI log that is hundreds of
updates glued into one line, with the next message appended to it. Every benchmark reports progress
through `progress()` instead, which picks the form from the stream:

- a TTY: a tqdm bar (imported lazily), cleared before any message is printed through `write()`;
- anything else: one plain line per `interval_s` seconds (and a final line), nothing else.

    with progress(total=len(items), desc="requests", unit="req") as bar:
        for item in items:
            ...
            bar.update()
        bar.write("table follows")   # never glued to a bar
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, Protocol, TextIO


class Progress(Protocol):
    """What a benchmark calls while it runs."""

    def update(self, n: int = 1) -> None: ...

    def write(self, message: str) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Progress: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class _Base:
    def __enter__(self) -> Progress:
        return self  # type: ignore[return-value]

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class LineProgress(_Base):
    """Plain lines `desc: done/total unit (pct %, elapsed s)` at most every `interval_s`, plus a final one."""

    def __init__(
        self, total: int | None, desc: str, unit: str, stream: TextIO, initial: int = 0, interval_s: float = 10.0
    ) -> None:
        self.total, self.desc, self.unit, self.stream = total, desc, unit, stream
        self.done = initial
        self.interval_s = interval_s
        self._start = time.monotonic()
        self._last = self._start
        self._closed = False

    def _line(self) -> str:
        elapsed = time.monotonic() - self._start
        if self.total:
            pct = 100.0 * self.done / self.total
            return f"{self.desc}: {self.done}/{self.total} {self.unit} ({pct:.0f} %, {elapsed:.1f} s)"
        return f"{self.desc}: {self.done} {self.unit} ({elapsed:.1f} s)"

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            print(self._line(), file=self.stream, flush=True)

    def write(self, message: str) -> None:
        print(message, file=self.stream, flush=True)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            print(self._line(), file=self.stream, flush=True)


class BarProgress(_Base):
    """A tqdm bar on a terminal; `write()` prints above it, `close()` removes it (leave=False)."""

    def __init__(self, total: int | None, desc: str, unit: str, stream: TextIO, initial: int = 0) -> None:
        from tqdm import tqdm

        self.stream = stream
        self._bar: Any = tqdm(
            total=total, initial=initial, desc=desc, unit=unit, file=stream, dynamic_ncols=True, leave=False
        )

    def update(self, n: int = 1) -> None:
        self._bar.update(n)

    def write(self, message: str) -> None:
        self._bar.write(message, file=self.stream)

    def close(self) -> None:
        self._bar.close()


class NoProgress(_Base):
    """Reports nothing (`enabled=False`); `write()` still prints."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def update(self, n: int = 1) -> None:
        pass

    def write(self, message: str) -> None:
        print(message, file=self.stream, flush=True)

    def close(self) -> None:
        pass


def progress(
    total: int | None,
    desc: str,
    unit: str = "it",
    *,
    stream: TextIO | None = None,
    initial: int = 0,
    enabled: bool = True,
    interval_s: float = 10.0,
) -> Progress:
    """A bar when `stream` (default stderr) is a terminal, periodic plain lines otherwise."""
    out = stream if stream is not None else sys.stderr
    if not enabled:
        return NoProgress(out)  # type: ignore[return-value]
    isatty = getattr(out, "isatty", None)
    if callable(isatty) and isatty():
        return BarProgress(total, desc, unit, out, initial)  # type: ignore[return-value]
    return LineProgress(total, desc, unit, out, initial, interval_s)  # type: ignore[return-value]


__all__ = ["BarProgress", "LineProgress", "NoProgress", "Progress", "progress"]
