# SPDX-License-Identifier: Apache-2.0
"""Run calls on one stream from many threads at once, with the overlap guaranteed rather than hoped for.

A test of "a chunk while another chunk of the same stream runs is refused" must not depend on the
scheduler: if the first call finished before the others started there would be no overlap to
refuse. `race` starts the calls together (a barrier) and holds the first call that reaches the
stream's computation until every other call has returned or raised, so the others meet a running
chunk for certain. A facade that queues instead of refusing leaves the held call waiting until
`hold_timeout_s` (then the queued calls run on a state they did not expect, and the test's audio
comparison fails): the bound is a guard against a hang, not a measured time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest


@dataclass
class RaceResult:
    """Per call: what it returned (None if it raised) and what it raised (None if it returned)."""

    outputs: list[Any]
    errors: list[BaseException | None]


def race(
    calls: Sequence[Callable[[], Any]],
    *,
    module: ModuleType,
    computation: str,
    monkeypatch: pytest.MonkeyPatch,
    hold_timeout_s: float = 20.0,
) -> RaceResult:
    """Run `calls` in one thread each, all at once; `module.computation` (what a chunk computes, called
    with the stream held) keeps the first caller until the other calls are done. Restores it after."""
    n = len(calls)
    real = getattr(module, computation)
    done = threading.Condition()
    finished = 0
    first = threading.Lock()

    def held(*args: Any, **kwargs: Any) -> Any:
        if first.acquire(blocking=False):  # only the first call waits; it never releases `first`
            with done:
                done.wait_for(lambda: finished >= n - 1, timeout=hold_timeout_s)
        return real(*args, **kwargs)

    outputs: list[Any] = [None] * n
    errors: list[BaseException | None] = [None] * n
    barrier = threading.Barrier(n)

    def worker(i: int) -> None:
        nonlocal finished
        barrier.wait()
        try:
            outputs[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - the test inspects every outcome
            errors[i] = exc
        with done:
            finished += 1
            done.notify_all()

    monkeypatch.setattr(module, computation, held)
    try:
        threads = [threading.Thread(target=worker, args=(i,), name=f"race-{i}") for i in range(n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        monkeypatch.setattr(module, computation, real)
    return RaceResult(outputs, errors)


__all__ = ["RaceResult", "race"]
