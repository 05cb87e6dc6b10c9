# SPDX-License-Identifier: Apache-2.0
"""Process-wide torch settings a test changes for its duration and restores: threads, default dtype.

- `one_intra_op_thread()`: reduced stand-in models run tiny ops; with 2 OpenMP threads on a busy
  2-core host each op can wait tens of ms for a spinning peer (measured 30x slower on the flow tests).
  Test packages that run such models use it in an autouse fixture.
- `process_default_dtype(dtype)`: what vLLM's `set_default_torch_dtype` does while a stage builds its
  model, for tests that check modules are built in float32 anyway.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from vllm_omni_token2wav.benchmarks.common import torch_threads


def one_intra_op_thread() -> contextlib.AbstractContextManager[None]:
    return torch_threads(1)


@contextlib.contextmanager
def process_default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
