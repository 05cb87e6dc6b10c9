# SPDX-License-Identifier: Apache-2.0
"""The CUDA capture guard against the real vLLM wrapper, monitor and forward context, on CPU.

The fake-based tests (`tests/patch/worker/test_graph_wrapper_guards.py`) pin the guard's
rule; these pin that the real `vllm.compilation.cuda_graph.CUDAGraphWrapper` fails the way the
fakes assume (capture disabled -> RuntimeError, and an empty entry left behind) and that the
installed guard turns that failure into a counted eager step while captured steps still replay
through the stock code. Nothing here needs a GPU: graphs are never captured, replay goes to a
stand-in graph object exposing `.replay()`.

vLLM is installed (its CPU build) by `tools/install_engine_cpu.sh`, which `tools/dev_setup.sh` runs. The
module is skipped only when the `vllm` distribution is not installed, and under CI (`CI` set) that
is an error instead: these tests must never skip silently there. An installed vLLM that fails to
import fails the tests rather than skipping them.
"""

from __future__ import annotations

import logging
import os
import sys
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.helpers.engine import require_engine, vllm_version
from tests.helpers.fake_vllm import install_fake_vllm
from vllm_omni_token2wav.patch.worker import patch_cuda_graph_wrapper as cuda_guard
from vllm_omni_token2wav.platforms import graph_capture_guard

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


require_engine("the real-vLLM capture-guard tests", omni=False)
VLLM_VERSION = vllm_version()


@dataclass(frozen=True)
class RealVllm:
    """The real vLLM modules the guard binds to."""

    cuda_graph: types.ModuleType
    monitor: types.ModuleType
    forward_context: types.ModuleType
    mode: Any  # vllm.config.CUDAGraphMode


def _is_real(module: types.ModuleType | None) -> bool:
    """The fakes of tests/helpers/fake_vllm.py are bare ModuleType objects without a file."""
    return module is not None and getattr(module, "__file__", None) is not None


@pytest.fixture(scope="module")
def real_vllm() -> Iterator[RealVllm]:
    """Import the real vLLM once for this module, undoing its import-time process tweaks afterwards.

    Importing vLLM sets a few environment variables (TORCHINDUCTOR_*, ...) and warning filters;
    they are restored when the module's tests are done so later tests in the process see the
    environment they would have seen without this module.
    """
    leaked = [name for name in ("vllm", "vllm.compilation.cuda_graph") if name in sys.modules]
    assert all(_is_real(sys.modules[name]) for name in leaked), f"fake vllm modules leaked into sys.modules: {leaked}"
    environ = dict(os.environ)
    filters = list(warnings.filters)

    import vllm.compilation.cuda_graph as cuda_graph
    import vllm.compilation.monitor as monitor
    from vllm import forward_context
    from vllm.config import CUDAGraphMode

    yield RealVllm(cuda_graph, monitor, forward_context, CUDAGraphMode)
    os.environ.clear()
    os.environ.update(environ)
    warnings.filters[:] = filters


@dataclass
class Step:
    """One guarded-wrapper scenario: the wrapper, its runnable's calls and the forward context."""

    vllm: RealVllm
    wrapper: Any
    calls: list[int]
    descriptor: Any

    @property
    def entries(self) -> dict[Any, Any]:
        return self.wrapper.concrete_cudagraph_entries

    def context(self, mode: Any = None) -> Any:
        """A forward context for this step (PIECEWISE unless `mode` is given), for override_forward_context."""
        fc = self.vllm.forward_context
        return fc.ForwardContext(
            no_compile_layers={},
            attn_metadata={},
            slot_mapping={},
            cudagraph_runtime_mode=self.vllm.mode.PIECEWISE if mode is None else mode,
            batch_descriptor=self.descriptor,
        )

    def run(self, x: int, mode: Any = None) -> Any:
        with self.vllm.forward_context.override_forward_context(self.context(mode)):
            return self.wrapper(x)


class StandInGraph:
    """What replay needs of a `torch.cuda.CUDAGraph`: `.replay()`."""

    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


@pytest.fixture
def step(real_vllm: RealVllm, monkeypatch: pytest.MonkeyPatch) -> Iterator[Step]:
    """A real PIECEWISE `CUDAGraphWrapper` on CPU with capturing disabled (after-startup state).

    The constructor asks the platform for its global CUDA graph pool; on a CPU host vLLM's
    `UnspecifiedPlatform` has no pool handle, so `get_global_graph_pool` returns None here. The
    constructor reads only `compilation_config` from the vLLM config, and a full `VllmConfig()`
    needs more of vLLM's requirements than the CPU install carries, so a stand-in namespace is used.
    """
    assert _is_real(sys.modules.get("vllm")) and _is_real(sys.modules.get("vllm.compilation.cuda_graph"))
    cuda_graph = real_vllm.cuda_graph
    monkeypatch.setattr(cuda_graph.current_platform, "get_global_graph_pool", lambda: None)
    stock_call = cuda_graph.CUDAGraphWrapper.__call__
    assert not graph_capture_guard.is_guarded(stock_call), "a guard from another test is still installed"
    capturing = real_vllm.monitor.cudagraph_capturing_enabled
    real_vllm.monitor.set_cudagraph_capturing_enabled(False)
    graph_capture_guard.clear_static_shape_capacity()
    cuda_guard.reset_stats()

    calls: list[int] = []

    def runnable(x: int) -> int:
        calls.append(x)
        return x * 2

    config = types.SimpleNamespace(compilation_config=None)
    wrapper = cuda_graph.CUDAGraphWrapper(runnable, config, real_vllm.mode.PIECEWISE)
    descriptor = real_vllm.forward_context.BatchDescriptor(num_tokens=8, num_reqs=8, uniform=True)
    yield Step(real_vllm, wrapper, calls, descriptor)

    cuda_guard.uninstall()
    cuda_guard.reset_stats()
    graph_capture_guard.clear_static_shape_capacity()
    real_vllm.monitor.set_cudagraph_capturing_enabled(capturing)
    assert cuda_graph.CUDAGraphWrapper.__call__ is stock_call


def _seed_captured(step: Step, output: Any) -> StandInGraph:
    graph = StandInGraph()
    step.entries[step.descriptor] = step.vllm.cuda_graph.CUDAGraphEntry(
        batch_descriptor=step.descriptor, cudagraph=graph, output=output
    )
    return graph


def test_stock_call_with_capture_disabled_raises_and_leaves_empty_entry(step: Step) -> None:
    with pytest.raises(RuntimeError, match="inappropriate time"):
        step.run(3)
    entry = step.entries[step.descriptor]
    assert entry.cudagraph is None and step.calls == []


def test_guard_runs_the_failing_step_eager_counts_it_and_warns_once(
    step: Step, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(RuntimeError, match="inappropriate time"):
        step.run(3)  # stock: raises, leaves the empty entry behind
    cuda_guard.install()
    with caplog.at_level(logging.WARNING, logger="vllm_omni_token2wav"):
        assert step.run(3) == 6
        assert step.run(4) == 8
    assert step.calls == [3, 4]
    assert step.entries[step.descriptor].cudagraph is None
    stats = cuda_guard.stats()
    assert stats["platform"] == "CUDA" and stats["eager_steps"] == 2
    assert list(stats["by_descriptor"].values()) == [2]
    warnings_logged = [r for r in caplog.records if "was not captured" in r.getMessage()]
    assert len(warnings_logged) == 1


def test_guard_runs_a_never_seen_descriptor_eager_without_creating_an_entry(step: Step) -> None:
    cuda_guard.install()
    assert step.run(5) == 10
    assert step.descriptor not in step.entries
    assert cuda_guard.stats()["eager_steps"] == 1


def test_captured_entry_replays_through_the_stock_call(step: Step) -> None:
    cuda_guard.install()
    graph = _seed_captured(step, output="captured output")
    assert step.run(1) == "captured output"
    assert step.run(2) == "captured output"
    assert graph.replays == 2 and step.calls == []
    assert cuda_guard.stats()["eager_steps"] == 0


@pytest.mark.parametrize("mode_name", ["NONE", "FULL"])
def test_none_and_mismatched_modes_stay_with_the_stock_eager_path(step: Step, mode_name: str) -> None:
    cuda_guard.install()
    assert step.run(7, mode=getattr(step.vllm.mode, mode_name)) == 14
    assert step.calls == [7] and step.entries == {}
    assert cuda_guard.stats()["eager_steps"] == 0


def test_no_forward_context_stays_with_the_stock_eager_path(step: Step) -> None:
    cuda_guard.install()
    assert not step.vllm.forward_context.is_forward_context_available()
    assert step.wrapper(6) == 12 and step.calls == [6]
    assert cuda_guard.stats()["eager_steps"] == 0


def test_active_capacity_replays_its_own_graph_on_the_real_wrapper(step: Step) -> None:
    cuda_guard.install()
    default_entries = step.entries
    graph_capture_guard.set_static_shape_capacity(1024)
    assert step.run(1) == 2  # nothing captured for capacity 1024 yet: eager
    assert step.entries is not default_entries  # the guard swapped in the capacity's dict
    graph = _seed_captured(step, output="capacity 1024")
    assert step.run(2) == "capacity 1024" and graph.replays == 1
    graph_capture_guard.clear_static_shape_capacity()
    assert step.run(3) == 6  # default dict: no graph -> eager
    assert step.entries is default_entries
    assert step.calls == [1, 3]


def test_double_install_wraps_once_and_uninstall_restores_the_stock_failure(step: Step) -> None:
    wrapper_cls = step.vllm.cuda_graph.CUDAGraphWrapper
    stock_call = wrapper_cls.__call__
    cuda_guard.install()
    patched = wrapper_cls.__call__
    cuda_guard.install()
    assert wrapper_cls.__call__ is patched and patched.__wrapped__ is stock_call
    assert step.run(1) == 2
    cuda_guard.uninstall()
    assert wrapper_cls.__call__ is stock_call
    with pytest.raises(RuntimeError, match="inappropriate time"):
        step.run(1)


def test_fake_vllm_hides_the_real_modules_and_gives_them_back(real_vllm: RealVllm) -> None:
    real_modules = {name: module for name, module in sys.modules.items() if name.split(".", 1)[0] == "vllm"}
    stock_call = real_vllm.cuda_graph.CUDAGraphWrapper.__call__
    patcher = pytest.MonkeyPatch()
    try:
        fake = install_fake_vllm(patcher)
        assert not _is_real(sys.modules["vllm"])
        assert sys.modules["vllm.compilation.cuda_graph"].CUDAGraphWrapper is fake.cuda_wrapper
        assert not any(_is_real(m) for n, m in sys.modules.items() if n.split(".", 1)[0] == "vllm")
        cuda_guard.install()  # lands on the fake class only
        assert real_vllm.cuda_graph.CUDAGraphWrapper.__call__ is stock_call
        cuda_guard.uninstall()
    finally:
        patcher.undo()
    assert {n: m for n, m in sys.modules.items() if n.split(".", 1)[0] == "vllm"} == real_modules
    assert real_vllm.cuda_graph.CUDAGraphWrapper.__call__ is stock_call
