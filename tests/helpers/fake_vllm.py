# SPDX-License-Identifier: Apache-2.0
"""Fake vllm / vllm_ascend modules for CPU tests of the graph-capture guard.

The fake wrappers' `__call__` mirrors the stock control flow of vLLM's `CUDAGraphWrapper` and
vllm-ascend's `ACLGraphWrapper` (graph-wrapper.md): eager when the mode is NONE or differs,
create the entry FIRST, validate capturing (raises when disabled) then capture, else replay.
The ACL variant has no forward-context availability check (no context -> AssertionError).
"""

from __future__ import annotations

import enum
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2

    def __bool__(self) -> bool:
        return self is not CUDAGraphMode.NONE


@dataclass(frozen=True)
class BatchDescriptor:
    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False
    has_lora: bool = False


@dataclass
class ForwardContext:
    cudagraph_runtime_mode: CUDAGraphMode = CUDAGraphMode.NONE
    batch_descriptor: BatchDescriptor | None = None


class FakeGraph:
    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


@dataclass
class Entry:
    batch_descriptor: BatchDescriptor
    graph: FakeGraph | None = None
    output: Any = None


def _make_wrapper_class(name: str, entries_attr: str, graph_attr: str, check_available: bool) -> type:
    def __init__(self: Any, runnable: Callable[..., Any], vllm_config: Any, runtime_mode: CUDAGraphMode) -> None:  # noqa: N807
        self.runnable = runnable
        self.vllm_config = vllm_config
        self.runtime_mode = runtime_mode
        setattr(self, entries_attr, {})

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807
        fc = sys.modules["vllm.forward_context"]
        if check_available and not fc.is_forward_context_available():
            return self.runnable(*args, **kwargs)
        ctx = fc.get_forward_context()
        mode = ctx.cudagraph_runtime_mode
        if mode == CUDAGraphMode.NONE or mode != self.runtime_mode:
            return self.runnable(*args, **kwargs)
        entries = getattr(self, entries_attr)
        desc = ctx.batch_descriptor
        if desc not in entries:
            entries[desc] = Entry(desc)
        entry = entries[desc]
        if getattr(entry, graph_attr) is None:
            sys.modules["vllm.compilation.monitor"].validate_cudagraph_capturing_enabled()
            entry.output = self.runnable(*args, **kwargs)
            setattr(entry, graph_attr, FakeGraph())
            return entry.output
        getattr(entry, graph_attr).replay()
        return entry.output

    return type(name, (), {"__init__": __init__, "__call__": __call__})


# Entries carry both attribute names so one Entry type serves both fakes.
Entry.aclgraph = property(lambda self: self.graph, lambda self, v: setattr(self, "graph", v))  # type: ignore[attr-defined]
Entry.cudagraph = property(lambda self: self.graph, lambda self, v: setattr(self, "graph", v))  # type: ignore[attr-defined]


@dataclass
class FakeVllm:
    monitor: types.ModuleType
    forward_context: types.ModuleType
    acl_wrapper: type
    cuda_wrapper: type

    def set_context(self, ctx: ForwardContext | None) -> None:
        self.forward_context._ctx = ctx  # type: ignore[attr-defined]


def install_fake_vllm(monkeypatch: pytest.MonkeyPatch) -> FakeVllm:
    """Register the fakes in `sys.modules` until `monkeypatch` is undone.

    Any real `vllm` / `vllm_ascend` module an earlier test imported (the real-vLLM tests share the
    process) is hidden first, so code under test sees only fakes and never a mix; `monkeypatch`
    puts the real modules back, unchanged, on undo.
    """
    for name in [n for n in sys.modules if n.split(".", 1)[0] in ("vllm", "vllm_ascend")]:
        monkeypatch.delitem(sys.modules, name)
    monitor = types.ModuleType("vllm.compilation.monitor")
    monitor.cudagraph_capturing_enabled = True  # type: ignore[attr-defined]

    def set_cudagraph_capturing_enabled(enabled: bool) -> None:
        monitor.cudagraph_capturing_enabled = enabled  # type: ignore[attr-defined]

    def validate_cudagraph_capturing_enabled() -> None:
        if not monitor.cudagraph_capturing_enabled:  # type: ignore[attr-defined]
            raise RuntimeError(
                "CUDA graph capturing detected at an inappropriate time. This operation is currently disabled."
            )

    monitor.set_cudagraph_capturing_enabled = set_cudagraph_capturing_enabled  # type: ignore[attr-defined]
    monitor.validate_cudagraph_capturing_enabled = validate_cudagraph_capturing_enabled  # type: ignore[attr-defined]

    fc = types.ModuleType("vllm.forward_context")
    fc._ctx = None  # type: ignore[attr-defined]
    fc.BatchDescriptor = BatchDescriptor  # type: ignore[attr-defined]
    fc.ForwardContext = ForwardContext  # type: ignore[attr-defined]

    def get_forward_context() -> ForwardContext:
        if fc._ctx is None:  # type: ignore[attr-defined]
            raise AssertionError("Forward context is not set.")
        return fc._ctx  # type: ignore[attr-defined]

    fc.get_forward_context = get_forward_context  # type: ignore[attr-defined]
    fc.is_forward_context_available = lambda: fc._ctx is not None  # type: ignore[attr-defined]

    config = types.ModuleType("vllm.config")
    config.CUDAGraphMode = CUDAGraphMode  # type: ignore[attr-defined]

    acl = types.ModuleType("vllm_ascend.compilation.acl_graph")
    acl.ACLGraphWrapper = _make_wrapper_class("ACLGraphWrapper", "concrete_aclgraph_entries", "aclgraph", False)  # type: ignore[attr-defined]
    cuda = types.ModuleType("vllm.compilation.cuda_graph")
    cuda.CUDAGraphWrapper = _make_wrapper_class("CUDAGraphWrapper", "concrete_cudagraph_entries", "cudagraph", True)  # type: ignore[attr-defined]

    vllm = types.ModuleType("vllm")
    compilation = types.ModuleType("vllm.compilation")
    vllm.compilation = compilation  # type: ignore[attr-defined]
    vllm.config = config  # type: ignore[attr-defined]
    vllm.forward_context = fc  # type: ignore[attr-defined]
    compilation.monitor = monitor  # type: ignore[attr-defined]
    compilation.cuda_graph = cuda  # type: ignore[attr-defined]
    ascend = types.ModuleType("vllm_ascend")
    ascend_comp = types.ModuleType("vllm_ascend.compilation")
    ascend.compilation = ascend_comp  # type: ignore[attr-defined]
    ascend_comp.acl_graph = acl  # type: ignore[attr-defined]
    for name, module in {
        "vllm": vllm,
        "vllm.compilation": compilation,
        "vllm.compilation.monitor": monitor,
        "vllm.compilation.cuda_graph": cuda,
        "vllm.config": config,
        "vllm.forward_context": fc,
        "vllm_ascend": ascend,
        "vllm_ascend.compilation": ascend_comp,
        "vllm_ascend.compilation.acl_graph": acl,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    return FakeVllm(monitor, fc, acl.ACLGraphWrapper, cuda.CUDAGraphWrapper)  # type: ignore[attr-defined]
