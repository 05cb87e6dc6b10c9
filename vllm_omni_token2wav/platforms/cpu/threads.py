# SPDX-License-Identifier: Apache-2.0
"""Intra-op threads of one CPU call: a scoped count, and how many of its budget the host can give now.

**Scoped count.** `torch.set_num_threads` looks process-global, but with the OpenMP backend of
torch's CPU builds the count that parallel ops use belongs to the calling OS thread: it sets that
thread's OpenMP `nthreads-var` and MKL's thread-local count. What it also changes is a
process-wide default that threads which have not run a parallel op yet adopt the first time they
do. So `intra_op_threads(n)` in one request thread does not affect ops already running in other
threads, and restoring on exit puts the default back (tests/platforms/cpu/test_threads.py).

**Budget under load.** torch's OpenMP regions split work statically, one share per thread, and
wait at a barrier for all of them: when another runnable thread holds one of the cores, every
region waits for the descheduled share. CAM++ runs ~1000 regions per call: on the 2-core build
host at load 2.5-3, 2-thread calls measured 200 ms (T=97) and 1090 ms (T=200) where 1-thread calls
take 20-40 ms, and onnxruntime's 2-thread session (work stealing) 66-80 ms in the same runs.
`call_threads(budget)` therefore samples the runnable threads of the host right before the call
(Linux `/proc/loadavg`, field 4, ~20 us) and gives the call only the cores nobody else is running
on, at least one. On a quiet host it returns the budget unchanged.
The sample counts every runnable thread but the caller, including this process's own OpenMP
workers while they still spin after an earlier parallel op (~15 ms): right after other torch work
a call may run with fewer threads than the host could give, never with more. Excluding the own
process's threads would cost ~65 us per call and would miss contention from other stages of the
same process. The thread count does not change CAM++'s result (bit-identical at 1-4 threads, see
`campplus.inference`), only its speed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

_LOADAVG = "/proc/loadavg"


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


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS / Windows
        return os.cpu_count() or 1


def other_runnable_threads(path: str = _LOADAVG) -> int | None:
    """Threads of the whole host that are runnable right now, not counting the caller; None if unknown."""
    try:
        with open(path) as handle:
            running = handle.read().split()[3].split("/")[0]
        return max(0, int(running) - 1)
    except (OSError, IndexError, ValueError):
        return None


def call_threads(budget: int, *, cores: int | None = None, others: int | None = -1) -> int:
    """Intra-op threads for one call: `budget`, capped by the cores other runnable threads leave free.

    `cores` defaults to `usable_cores()`, `others` to a fresh `other_runnable_threads()` sample
    (pass None for "unknown": the budget is kept). Always >= 1.
    """
    if budget <= 1:
        return 1
    if others == -1:
        others = other_runnable_threads()
    if others is None:
        return budget
    free = (usable_cores() if cores is None else cores) - others
    return max(1, min(budget, free))


__all__ = ["call_threads", "intra_op_threads", "other_runnable_threads", "usable_cores"]
