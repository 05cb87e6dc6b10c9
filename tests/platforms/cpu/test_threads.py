# SPDX-License-Identifier: Apache-2.0
"""`intra_op_threads`: a scoped intra-op thread count for the calling thread only."""

from __future__ import annotations

import threading

import pytest
import torch

from vllm_omni_token2wav.platforms.cpu.threads import intra_op_threads

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


def test_other_runnable_threads_reads_the_host_count_without_the_caller(tmp_path) -> None:
    from vllm_omni_token2wav.platforms.cpu.threads import other_runnable_threads

    fake = tmp_path / "loadavg"
    fake.write_text("1.81 1.58 2.86 3/96 13660\n")
    assert other_runnable_threads(str(fake)) == 2
    fake.write_text("0.00 0.00 0.00 1/50 1\n")
    assert other_runnable_threads(str(fake)) == 0
    fake.write_text("garbage\n")
    assert other_runnable_threads(str(fake)) is None
    assert other_runnable_threads(str(tmp_path / "missing")) is None


@pytest.mark.parametrize(
    ("budget", "cores", "others", "want"),
    [
        (2, 2, 0, 2),  # quiet host: the whole budget
        (2, 2, 1, 1),  # one core taken: one thread, not a stalled barrier
        (2, 2, 5, 1),  # never below one
        (4, 8, 5, 3),
        (4, 8, 0, 4),  # never above the budget
        (1, 8, 0, 1),
        (2, 2, None, 2),  # unknown host state: the budget
    ],
)
def test_call_threads_gives_the_budget_minus_busy_cores(budget: int, cores: int, others: int | None, want: int) -> None:
    from vllm_omni_token2wav.platforms.cpu.threads import call_threads

    assert call_threads(budget, cores=cores, others=others) == want
