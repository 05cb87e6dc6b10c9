# SPDX-License-Identifier: Apache-2.0
"""`intra_op_threads`: a scoped intra-op thread count for the calling thread only."""

from __future__ import annotations

import threading

import pytest
import torch

from vllm_omni.platforms.cpu.threads import intra_op_threads

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def test_scoped_count_applies_inside_and_is_restored() -> None:
    previous = torch.get_num_threads()
    with intra_op_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == previous
    with pytest.raises(RuntimeError), intra_op_threads(1):
        raise RuntimeError("the count is restored on errors too")
    assert torch.get_num_threads() == previous


def test_other_threads_keep_their_count_and_new_threads_the_default() -> None:
    previous = torch.get_num_threads()
    seen: dict[str, int] = {}
    inside = threading.Event()
    release = threading.Event()

    def scoped() -> None:
        with intra_op_threads(previous + 1):
            seen["scoped"] = torch.get_num_threads()
            inside.set()
            release.wait(10)

    worker = threading.Thread(target=scoped)
    worker.start()
    assert inside.wait(10)
    seen["main, while another thread is scoped"] = torch.get_num_threads()
    release.set()
    worker.join()
    fresh = threading.Thread(target=lambda: seen.__setitem__("a thread started afterwards", torch.get_num_threads()))
    fresh.start()
    fresh.join()
    assert seen == {
        "scoped": previous + 1,
        "main, while another thread is scoped": previous,
        "a thread started afterwards": previous,
    }


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_counts_are_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="intra-op threads"), intra_op_threads(bad):  # type: ignore[arg-type]
        pass
