# SPDX-License-Identifier: Apache-2.0
"""One intra-op thread for tests that run the reduced stand-in models.

The reduced models run tiny ops: with 2 OpenMP threads on a busy 2-core host each op can wait tens
of ms for a spinning peer (measured 30x slower). Use from a conftest:

    _single_intra_op_thread = pytest.fixture(autouse=True)(single_intra_op_thread)
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def single_intra_op_thread() -> Iterator[None]:
    """Run the test with `torch.set_num_threads(1)`, restoring the previous count afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
