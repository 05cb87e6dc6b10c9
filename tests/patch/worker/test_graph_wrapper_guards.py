# SPDX-License-Identifier: Apache-2.0
"""The capture guard on ACLGraphWrapper and CUDAGraphWrapper, against fakes that mirror the stock flow."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.helpers.fake_vllm import BatchDescriptor, CUDAGraphMode, Entry, FakeGraph, ForwardContext, install_fake_vllm
from vllm_omni_token2wav.patch.worker import patch_acl_graph_wrapper as acl_guard
from vllm_omni_token2wav.patch.worker import patch_cuda_graph_wrapper as cuda_guard
from vllm_omni_token2wav.platforms import graph_capture_guard

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

DESC = BatchDescriptor(num_tokens=8, num_reqs=8, uniform=True)
DESC_OTHER = BatchDescriptor(num_tokens=16, num_reqs=16, uniform=True)


@dataclass
class Target:
    wrapper_cls: type
    entries_attr: str
    install: Callable[[], None]
    uninstall: Callable[[], None]
    stats: Callable[[], dict[str, Any]]
    reset: Callable[[], None]


@pytest.fixture(params=["acl", "cuda"])
def env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Target]]:
    fake = install_fake_vllm(monkeypatch)
    if request.param == "acl":
        target = Target(
            fake.acl_wrapper,
            "concrete_aclgraph_entries",
            acl_guard.install,
            acl_guard.uninstall,
            acl_guard.stats,
            acl_guard.reset_stats,
        )
    else:
        target = Target(
            fake.cuda_wrapper,
            "concrete_cudagraph_entries",
            cuda_guard.install,
            cuda_guard.uninstall,
            cuda_guard.stats,
            cuda_guard.reset_stats,
        )
    stock = target.wrapper_cls.__call__
    target.reset()
    graph_capture_guard.clear_static_shape_capacity()
    yield fake, target
    target.uninstall()
    graph_capture_guard.clear_static_shape_capacity()
    target.reset()
    assert target.wrapper_cls.__call__ is stock


class Runnable:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x: int) -> int:
        self.calls += 1
        return x * 2


def _wrapper(target: Target, mode: CUDAGraphMode = CUDAGraphMode.PIECEWISE) -> tuple[Any, Runnable]:
    runnable = Runnable()
    return target.wrapper_cls(runnable, object(), mode), runnable


def _decode_step(fake: Any, mode: CUDAGraphMode = CUDAGraphMode.PIECEWISE) -> None:
    fake.set_context(ForwardContext(cudagraph_runtime_mode=mode, batch_descriptor=DESC))


def test_stock_call_raises_without_guard_and_leaves_empty_entry(env: tuple[Any, Target]) -> None:
    fake, target = env
    wrapper, _ = _wrapper(target)
    _decode_step(fake)
    fake.monitor.set_cudagraph_capturing_enabled(False)
    with pytest.raises(RuntimeError, match="inappropriate time"):
        wrapper(3)
    assert getattr(wrapper, target.entries_attr)[DESC].graph is None


def test_capture_disabled_and_no_entry_runs_eager_and_counts(
    env: tuple[Any, Target], caplog: pytest.LogCaptureFixture
) -> None:
    fake, target = env
    target.install()
    wrapper, runnable = _wrapper(target)
    _decode_step(fake)
    fake.monitor.set_cudagraph_capturing_enabled(False)
    with caplog.at_level(logging.WARNING, logger="vllm_omni_token2wav"):
        assert wrapper(3) == 6
        assert wrapper(4) == 8
    assert runnable.calls == 2
    assert DESC not in getattr(wrapper, target.entries_attr)
    stats = target.stats()
    assert stats["eager_steps"] == 2
    assert list(stats["by_descriptor"].values()) == [2]
    warnings = [r for r in caplog.records if "was not captured" in r.getMessage()]
    assert len(warnings) == 1


def test_empty_entry_left_by_failed_stock_call_runs_eager(env: tuple[Any, Target]) -> None:
    fake, target = env
    wrapper, runnable = _wrapper(target)
    getattr(wrapper, target.entries_attr)[DESC] = Entry(DESC)
    target.install()
    _decode_step(fake)
    fake.monitor.set_cudagraph_capturing_enabled(False)
    assert wrapper(5) == 10 and runnable.calls == 1


def test_captured_entry_replays_without_calling_runnable(env: tuple[Any, Target]) -> None:
    fake, target = env
    target.install()
    wrapper, runnable = _wrapper(target)
    graph = FakeGraph()
    getattr(wrapper, target.entries_attr)[DESC] = Entry(DESC, graph=graph, output="captured")
    _decode_step(fake)
    fake.monitor.set_cudagraph_capturing_enabled(False)
    assert wrapper(1) == "captured"
    assert graph.replays == 1 and runnable.calls == 0
    assert target.stats()["eager_steps"] == 0


def test_capture_window_captures_then_replays(env: tuple[Any, Target]) -> None:
    fake, target = env
    target.install()
    wrapper, runnable = _wrapper(target)
    _decode_step(fake)
    assert wrapper(2) == 4  # capture window: stock path captures
    entry = getattr(wrapper, target.entries_attr)[DESC]
    assert entry.graph is not None and runnable.calls == 1
    fake.monitor.set_cudagraph_capturing_enabled(False)
    assert wrapper(9) == 4  # replay returns the captured output
    assert entry.graph.replays == 1 and runnable.calls == 1


def test_keyword_arguments_reach_the_runnable_on_every_path(env: tuple[Any, Target]) -> None:
    fake, target = env
    target.install()
    wrapper, runnable = _wrapper(target)
    _decode_step(fake)
    assert wrapper(x=2) == 4  # capture window: the stock call captures
    fake.monitor.set_cudagraph_capturing_enabled(False)
    assert wrapper(x=9) == 4 and runnable.calls == 1  # replay
    fake.set_context(ForwardContext(cudagraph_runtime_mode=CUDAGraphMode.PIECEWISE, batch_descriptor=DESC_OTHER))
    assert wrapper(x=5) == 10 and runnable.calls == 2  # never captured: eager through the guard


@pytest.mark.parametrize(
    ("ctx_mode", "wrapper_mode"),
    [(CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE), (CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE)],
)
def test_none_and_mismatched_modes_pass_through(
    env: tuple[Any, Target], ctx_mode: CUDAGraphMode, wrapper_mode: CUDAGraphMode
) -> None:
    fake, target = env
    target.install()
    wrapper, runnable = _wrapper(target, wrapper_mode)
    _decode_step(fake, ctx_mode)
    fake.monitor.set_cudagraph_capturing_enabled(False)
    assert wrapper(1) == 2 and runnable.calls == 1
    assert target.stats()["eager_steps"] == 0  # the stock call ran eager itself


def test_no_forward_context_keeps_stock_behaviour(env: tuple[Any, Target]) -> None:
    fake, target = env
    target.install()
    wrapper, runnable = _wrapper(target)
    fake.set_context(None)
    if target.wrapper_cls is fake.acl_wrapper:
        with pytest.raises(AssertionError, match="Forward context"):
            wrapper(1)
    else:
        assert wrapper(1) == 2 and runnable.calls == 1
    assert target.stats()["eager_steps"] == 0


def test_getter_without_its_assertion_still_means_no_context(
    env: tuple[Any, Target], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under `python -O` vLLM's get_forward_context returns None instead of asserting: still stock behaviour."""
    fake, target = env
    fc = sys.modules["vllm.forward_context"]
    monkeypatch.setattr(fc, "get_forward_context", lambda: fc._ctx)
    target.install()
    wrapper, runnable = _wrapper(target)
    fake.set_context(None)
    if target.wrapper_cls is fake.acl_wrapper:
        with pytest.raises(AttributeError):  # the stock ACL call itself has no availability check
            wrapper(1)
    else:
        assert wrapper(1) == 2 and runnable.calls == 1
    assert target.stats()["eager_steps"] == 0


def test_flag_flipped_after_install_is_read_live(env: tuple[Any, Target]) -> None:
    fake, target = env
    fake.monitor.set_cudagraph_capturing_enabled(False)
    target.install()
    wrapper, _ = _wrapper(target)
    _decode_step(fake)
    fake.monitor.set_cudagraph_capturing_enabled(True)
    wrapper(1)  # captures, because the flag is True now
    assert getattr(wrapper, target.entries_attr)[DESC].graph is not None
    assert target.stats()["eager_steps"] == 0


def test_double_install_wraps_once_and_uninstall_restores(env: tuple[Any, Target]) -> None:
    _, target = env
    stock = target.wrapper_cls.__call__
    target.install()
    patched = target.wrapper_cls.__call__
    target.install()
    assert target.wrapper_cls.__call__ is patched
    assert patched.__wrapped__ is stock
    target.uninstall()
    assert target.wrapper_cls.__call__ is stock
    target.uninstall()  # idempotent
    assert target.wrapper_cls.__call__ is stock


def test_active_capacity_uses_its_own_entries_and_replays(env: tuple[Any, Target]) -> None:
    fake, target = env
    target.install()
    wrapper, runnable = _wrapper(target)
    _decode_step(fake)
    graph_capture_guard.set_static_shape_capacity(1024)
    wrapper(1)  # capture window, capacity 1024: captured into that capacity's dict
    fake.monitor.set_cudagraph_capturing_enabled(False)
    assert wrapper(1) == 2 and runnable.calls == 1  # replays the capacity graph
    graph_capture_guard.set_static_shape_capacity(2048)
    assert wrapper(3) == 6 and runnable.calls == 2  # other capacity: never captured -> eager
    graph_capture_guard.clear_static_shape_capacity()
    assert wrapper(4) == 8 and runnable.calls == 3  # default dict has no graph either -> eager
    graph_capture_guard.set_static_shape_capacity(1024)
    assert wrapper(5) == 2 and runnable.calls == 3  # back on 1024: replay
    keys = target.stats()["by_descriptor"]
    assert sorted(k.rsplit("=", 1)[1] for k in keys) == ["2048", "None"]


def test_capacity_state_api() -> None:
    assert graph_capture_guard.current_static_shape_capacity() is None
    graph_capture_guard.set_static_shape_capacity(512)
    assert graph_capture_guard.current_static_shape_capacity() == 512
    graph_capture_guard.clear_static_shape_capacity()
    assert graph_capture_guard.current_static_shape_capacity() is None
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive int"):
            graph_capture_guard.set_static_shape_capacity(bad)  # type: ignore[arg-type]
