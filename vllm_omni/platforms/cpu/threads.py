# SPDX-License-Identifier: Apache-2.0
"""Run one call with a given number of torch intra-op threads, then restore the previous count.

`torch.set_num_threads` looks process-global, but with the OpenMP backend of torch's CPU builds
the count that parallel ops use belongs to the calling OS thread: it sets that thread's OpenMP
`nthreads-var` and MKL's thread-local count. What it also changes is a process-wide default that
threads which have not run a parallel op yet adopt the first time they do. So a scoped change in
one request thread does not affect ops already running in other threads; restoring on exit puts
the default back (checked in tests/platforms/cpu/test_threads.py).

Used by the speaker-embedding benchmark to time torch at each thread budget in one process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def intra_op_threads(threads: int) -> Iterator[None]:
    """Within the block, torch ops of the calling thread use `threads` intra-op threads."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"intra-op threads must be an int >= 1, got {threads!r}")
    previous = torch.get_num_threads()
    if previous == threads:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


__all__ = ["intra_op_threads"]
