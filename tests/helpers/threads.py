# SPDX-License-Identifier: Apache-2.0
"""Run reduced-model tests on one intra-op thread (restored afterwards).

Reduced stand-in models run tiny ops: with 2 OpenMP threads on a busy 2-core host each op can wait
tens of ms for a spinning peer (measured 30x slower on the flow tests). Test packages that run such
models use `one_intra_op_thread()` in an autouse fixture.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def one_intra_op_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
