# SPDX-License-Identifier: Apache-2.0
"""A fake device-graph runtime for CPU tests, with the names of `torch.cuda` / `torch.npu`'s graph API.

`FakeGraphModule` has `NPUGraph` (also as `CUDAGraph`), `graph(g, pool=None, stream=None,
capture_error_mode="global")`, `graph_pool_handle()`, `Stream`, `stream(s)`, `current_stream(device)`
and `Event`, so the real adapter (`platforms.graph_api.TorchGraphApi`) and the capture helper run
unchanged on CPU tensors.

A capture records every aten op the capturing thread dispatches (a `TorchDispatchMode`, thread-local
like a capture in `thread_local` mode). `replay()` re-runs the recorded ops in order on the same
tensors: an op that allocates writes its result into the tensor the capture produced, in-place ops and
views act on the captured tensors themselves. So, as with a real graph:

- a replay reads the current contents of the tensors the capture read (the static input buffers) and
  overwrites the tensors it produced (the static outputs);
- Python control flow and Python values are frozen at capture time;
- tensors allocated during the capture hold garbage (NaN / a sentinel) until the first replay, because
  a real capture executes nothing;
- a host synchronisation during capture (`.item()`, `torch.equal`, `bool(tensor)`) fails the capture;
- two captures in flight at once in one process fail (torch allows one).

Every tensor an op reads or writes is recorded as an alias with the shape, strides and offset it
had when the op ran, so ops that change a tensor's metadata in place (`transpose_` inside
`torch.stft`, `squeeze_`) are not replayed: like a real graph, a replay repeats data movement only.

Differences: ops do execute during a fake capture (their in-place effects on pre-existing tensors
happen once more than on a device), and there is no real memory pool (pool tokens are only recorded).

The module records what tests assert on: `captures` (pool, stream, capture_error_mode per capture),
`replays` per graph, `stream_waits`, `event_records`, and `fail_captures` makes the next N
`capture_end` calls raise.
"""

from __future__ import annotations

import itertools
import sys
import threading
import types
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.helpers.fake_npu import FakeNpuModule
from vllm_omni_token2wav.platforms.graph_api import TorchGraphApi

_HOST_SYNC_OPS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.equal.default,
    torch.ops.aten.is_nonzero.default,
}
_INT_POISON = -123456789
# In-place ops that change only a tensor's metadata: no device work, nothing to replay.
_METADATA_OPS = {
    torch.ops.aten.transpose_.default,
    torch.ops.aten.t_.default,
    torch.ops.aten.squeeze_.default,
    torch.ops.aten.squeeze_.dim,
    torch.ops.aten.unsqueeze_.default,
    torch.ops.aten.as_strided_.default,
    torch.ops.aten.swapdims_.default,
    torch.ops.aten.detach_.default,
}


class FakeCaptureError(RuntimeError):
    """What the fake runtime raises where a real capture would fail."""


@dataclass
class _Op:
    func: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outputs: list[torch.Tensor]
    fresh: list[bool]  # per output: allocated by the op (True) or an alias / in-place result (False)


def _flat(out: Any) -> list[Any]:
    return list(out) if isinstance(out, tuple | list) else [out]


def _frozen(obj: Any) -> Any:
    """Tensors (also inside lists / tuples) as aliases with their current shape, strides and offset."""
    if isinstance(obj, torch.Tensor):
        return obj.as_strided(obj.size(), obj.stride(), obj.storage_offset())
    if isinstance(obj, list | tuple):
        return type(obj)(_frozen(o) for o in obj)
    return obj


def _fresh_flags(func: Any, out: Any) -> list[bool]:
    returns = func._schema.returns
    flat = _flat(out)
    if len(returns) == 1:
        return [returns[0].alias_info is None] * len(flat)
    return [r.alias_info is None for r in returns][: len(flat)]


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[_Op] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _HOST_SYNC_OPS:
            raise FakeCaptureError(f"{func} synchronises with the host during graph capture")
        frozen_args, frozen_kwargs = _frozen(args), {k: _frozen(v) for k, v in kwargs.items()}
        out = func(*args, **kwargs)
        if func in _METADATA_OPS:
            return out
        flat = _flat(out)
        fresh = _fresh_flags(func, out)
        keep = [(_frozen(t), f) for t, f in zip(flat, fresh, strict=False) if isinstance(t, torch.Tensor)]
        self.ops.append(_Op(func, frozen_args, frozen_kwargs, [t for t, _ in keep], [f for _, f in keep]))
        return out


class FakePool:
    """A memory-pool token (identity only)."""

    _ids = itertools.count(1)

    def __init__(self) -> None:
        self.id = next(self._ids)

    def __repr__(self) -> str:
        return f"FakePool({self.id})"


class FakeGraph:
    """`NPUGraph` / `CUDAGraph` stand-in: records at capture, re-runs the recorded ops at replay."""

    def __init__(self) -> None:
        self.ops: list[_Op] = []
        self.captured = False
        self.replays = 0
        self._pool: FakePool | None = None
        self._recorder: _Recorder | None = None
        self.module: FakeGraphRuntime | None = None

    def capture_begin(self, pool: FakePool | None = None, capture_error_mode: str = "global") -> None:
        self._pool = pool if pool is not None else FakePool()
        self._recorder = _Recorder()
        self._recorder.__enter__()

    def capture_end(self) -> None:
        recorder, self._recorder = self._recorder, None
        assert recorder is not None, "capture_end without capture_begin"
        recorder.__exit__(None, None, None)
        module = self.module
        if module is not None and module.fail_captures > 0:
            module.fail_captures -= 1
            raise FakeCaptureError("injected capture failure (fail_captures)")
        self.ops = recorder.ops
        self.captured = True
        # A real capture executes nothing: what it allocated holds garbage until the first replay.
        with torch.inference_mode():
            for op in self.ops:
                for tensor, fresh in zip(op.outputs, op.fresh, strict=True):
                    if fresh and tensor.numel():
                        if tensor.dtype.is_floating_point:
                            tensor.fill_(float("nan"))
                        elif tensor.dtype != torch.bool:
                            tensor.fill_(_INT_POISON)

    def abort_capture(self) -> None:
        recorder, self._recorder = self._recorder, None
        if recorder is not None:
            recorder.__exit__(None, None, None)

    def replay(self) -> None:
        if not self.captured:
            raise FakeCaptureError("replay of a graph that was never captured")
        self.replays += 1
        with torch.inference_mode():
            for op in self.ops:
                new = _flat(op.func(*op.args, **op.kwargs))
                new_tensors = [t for t in new if isinstance(t, torch.Tensor)]
                for recorded, result, fresh in zip(op.outputs, new_tensors, op.fresh, strict=True):
                    if fresh:
                        recorded.copy_(result)

    def reset(self) -> None:
        self.ops = []
        self.captured = False

    def pool(self) -> FakePool:
        if self._pool is None:
            self._pool = FakePool()
        return self._pool


class FakeStream:
    def __init__(self, device: Any = None, name: str = "side") -> None:
        self.device = device
        self.name = name
        self.waited_streams: list[FakeStream] = []
        self.waited_events: list[FakeEvent] = []

    def wait_stream(self, other: FakeStream) -> None:
        self.waited_streams.append(other)

    def wait_event(self, event: FakeEvent) -> None:
        self.waited_events.append(event)

    def __repr__(self) -> str:
        return f"FakeStream({self.name})"


class FakeEvent:
    def __init__(self) -> None:
        self.recorded_on: list[FakeStream] = []

    def record(self, stream: FakeStream | None = None) -> None:
        self.recorded_on.append(stream if stream is not None else FakeStream(name="current"))


@dataclass
class CaptureCall:
    graph: FakeGraph
    pool: Any
    stream: Any
    capture_error_mode: str
    thread: str


class FakeGraphRuntime:
    """The graph part of a fake device module (mixed into a `types.ModuleType` subclass)."""

    def _init_graphs(self) -> None:
        self.NPUGraph = self._new_graph
        self.CUDAGraph = self._new_graph
        self.captures: list[CaptureCall] = []
        self.graphs: list[FakeGraph] = []
        self.fail_captures = 0
        self.max_concurrent_captures = 0
        self._active_captures = 0
        self._state_lock = threading.Lock()
        self._current = threading.local()
        self.default_stream = FakeStream(name="default")

    def _new_graph(self) -> FakeGraph:
        graph = FakeGraph()
        graph.module = self
        with self._state_lock:
            self.graphs.append(graph)
        return graph

    def graph_pool_handle(self) -> FakePool:
        return FakePool()

    def Stream(self, device: Any = None) -> FakeStream:  # noqa: N802 - torch's name
        return FakeStream(device)

    def Event(self) -> FakeEvent:  # noqa: N802 - torch's name
        return FakeEvent()

    def current_stream(self, device: Any = None) -> FakeStream:
        return getattr(self._current, "stream", None) or self.default_stream

    def stream(self, stream: FakeStream) -> _StreamContext:
        return _StreamContext(self, stream)

    def graph(
        self, graph: FakeGraph, pool: Any = None, stream: Any = None, capture_error_mode: str = "global"
    ) -> _GraphContext:
        return _GraphContext(self, graph, pool, stream, capture_error_mode)

    @property
    def replays(self) -> int:
        return sum(g.replays for g in self.graphs)


class _StreamContext:
    def __init__(self, runtime: FakeGraphRuntime, stream: FakeStream) -> None:
        self._runtime = runtime
        self._stream = stream
        self._previous: FakeStream | None = None

    def __enter__(self) -> FakeStream:
        self._previous = getattr(self._runtime._current, "stream", None)
        self._runtime._current.stream = self._stream
        return self._stream

    def __exit__(self, *exc: object) -> None:
        self._runtime._current.stream = self._previous


class _GraphContext:
    def __init__(
        self, runtime: FakeGraphRuntime, graph: FakeGraph, pool: Any, stream: Any, capture_error_mode: str
    ) -> None:
        self._runtime = runtime
        self._graph = graph
        self._pool = pool
        self._stream = stream if stream is not None else FakeStream(name="capture-default")
        self._mode = capture_error_mode
        self._stream_ctx = _StreamContext(runtime, self._stream)

    def __enter__(self) -> None:
        runtime = self._runtime
        with runtime._state_lock:
            runtime._active_captures += 1
            concurrent = runtime._active_captures
            runtime.max_concurrent_captures = max(runtime.max_concurrent_captures, concurrent)
            runtime.captures.append(
                CaptureCall(self._graph, self._pool, self._stream, self._mode, threading.current_thread().name)
            )
        if concurrent > 1:
            with runtime._state_lock:
                runtime._active_captures -= 1
            raise FakeCaptureError("another graph capture is in flight in this process")
        self._stream_ctx.__enter__()
        self._graph.capture_begin(self._pool, capture_error_mode=self._mode)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc_type is None:
                self._graph.capture_end()
            else:  # the capture is invalid: end recording, keep the graph uncaptured, let the error propagate
                self._graph.abort_capture()
        finally:
            self._stream_ctx.__exit__(exc_type, exc, tb)
            with self._runtime._state_lock:
                self._runtime._active_captures -= 1


class FakeGraphModule(FakeGraphRuntime, types.ModuleType):
    """A stand-alone fake device module with only the graph API (for `TorchGraphApi(module, ...)`)."""

    def __init__(self, name: str = "fake_device") -> None:
        types.ModuleType.__init__(self, name)
        self._init_graphs()


class FakeNpuGraphModule(FakeGraphRuntime, FakeNpuModule):
    """`FakeNpuModule` (what the platform layer uses of `torch.npu`) plus the NPU graph API."""

    def __init__(self, available: bool = True, count: int = 1) -> None:
        FakeNpuModule.__init__(self, available, count)
        self._init_graphs()


def fake_graph_api(module: FakeGraphModule | None = None) -> tuple[TorchGraphApi, FakeGraphModule]:
    """The real adapter over a fresh (or the given) fake module, and that module."""
    module = module if module is not None else FakeGraphModule()
    return TorchGraphApi(module, "NPUGraph", "fake-graph"), module


def install_fake_npu_with_graphs(monkeypatch: pytest.MonkeyPatch) -> FakeNpuGraphModule:
    """Register a fake `torch_npu` and a `torch.npu` that has the NPU graph API."""
    module = FakeNpuGraphModule()
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    monkeypatch.setattr(torch, "npu", module, raising=False)
    return module
