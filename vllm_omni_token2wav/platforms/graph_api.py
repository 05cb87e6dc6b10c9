# SPDX-License-Identifier: Apache-2.0
"""What the device-graph capture helper needs from a platform's graph runtime.

CUDA (`torch.cuda`) and Ascend (`torch.npu`, registered by `torch_npu`) expose the same graph API
under the same names: a graph class (`CUDAGraph` / `NPUGraph`) with `replay()` and `pool()`, a
capture context `graph(g, pool=None, stream=None, capture_error_mode=...)`, `graph_pool_handle()`,
and the stream/event types the capture needs (`Stream`, `stream(s)`, `current_stream(device)`,
`Event`). `TorchGraphApi` adapts one such device module to the `DeviceGraphApi` Protocol; the
platform objects build it (`DevicePlatform.device_graph_api()`), so the capture helper
(`platforms/device_graphs.py`) never names `torch.cuda` or `torch.npu`, and tests hand it a fake
device module with the same names.

Capture mode: `thread_local` where the runtime accepts the argument. The default `global` mode makes
a capture fail when *another* thread does something unsafe while it runs (a `cudaMalloc` of an eager
request, a synchronize); a serving process runs eager work on other threads, so only the capturing
thread's own actions may invalidate its capture. torch_npu releases without the argument capture in
their default mode.
"""

from __future__ import annotations

import inspect
from contextlib import AbstractContextManager
from typing import Any, Final, Protocol

import torch

CAPTURE_ERROR_MODE: Final = "thread_local"
#: Names a device module must have for `TorchGraphApi` (the graph class name is checked separately).
REQUIRED_NAMES: Final = ("graph", "graph_pool_handle", "Stream", "stream", "current_stream", "Event")


class DeviceGraph(Protocol):
    """One captured graph: `replay()` re-runs the recorded device work on the same memory."""

    def replay(self) -> None: ...


class DeviceGraphApi(Protocol):
    """The graph runtime of one device type, as the capture helper uses it.

    Streams and events are the runtime's own objects: streams have `wait_stream(other)` and
    `wait_event(event)`, events have `record(stream)`.
    """

    @property
    def name(self) -> str:
        """Short label for logs and counters, e.g. `"cuda-graph"`, `"npu-graph"`."""
        ...

    def new_graph(self) -> DeviceGraph: ...

    def new_pool(self) -> Any:
        """A memory-pool token; every capture given the same token shares one private pool."""
        ...

    def new_stream(self, device: torch.device) -> Any: ...

    def current_stream(self, device: torch.device) -> Any: ...

    def use_stream(self, stream: Any) -> AbstractContextManager[Any]:
        """Make `stream` the current stream inside the `with` block."""
        ...

    def capture(self, graph: DeviceGraph, *, pool: Any, stream: Any) -> AbstractContextManager[Any]:
        """Record the device work queued inside the `with` block into `graph` (nothing executes)."""
        ...

    def new_event(self) -> Any: ...


def missing_graph_names(module: Any, graph_class: str) -> list[str]:
    """Names of the graph API that `module` lacks (empty when `TorchGraphApi` can wrap it)."""
    return [name for name in (graph_class, *REQUIRED_NAMES) if not hasattr(module, name)]


class TorchGraphApi:
    """`DeviceGraphApi` over a torch device module (`torch.cuda`, `torch.npu`) and its graph class name."""

    def __init__(self, module: Any, graph_class: str, name: str) -> None:
        missing = missing_graph_names(module, graph_class)
        if missing:
            raise RuntimeError(
                f"{name}: device module {getattr(module, '__name__', module)!r} has no {', '.join(missing)}; "
                "this runtime has no graph capture API (upgrade torch / torch_npu, or disable device graphs)"
            )
        self._module = module
        self._graph_class = getattr(module, graph_class)
        self._name = name
        try:
            accepts_mode = "capture_error_mode" in inspect.signature(module.graph).parameters
        except (TypeError, ValueError):  # builtins without a signature
            accepts_mode = False
        self._capture_kwargs: dict[str, Any] = {"capture_error_mode": CAPTURE_ERROR_MODE} if accepts_mode else {}

    @property
    def name(self) -> str:
        return self._name

    @property
    def capture_error_mode(self) -> str | None:
        """The mode passed to every capture, or None where the runtime has no such argument."""
        return self._capture_kwargs.get("capture_error_mode")

    def new_graph(self) -> DeviceGraph:
        return self._graph_class()  # type: ignore[no-any-return]

    def new_pool(self) -> Any:
        return self._module.graph_pool_handle()

    def new_stream(self, device: torch.device) -> Any:
        return self._module.Stream(device=device)

    def current_stream(self, device: torch.device) -> Any:
        return self._module.current_stream(device)

    def use_stream(self, stream: Any) -> AbstractContextManager[Any]:
        return self._module.stream(stream)  # type: ignore[no-any-return]

    def capture(self, graph: DeviceGraph, *, pool: Any, stream: Any) -> AbstractContextManager[Any]:
        return self._module.graph(graph, pool=pool, stream=stream, **self._capture_kwargs)  # type: ignore[no-any-return]

    def new_event(self) -> Any:
        return self._module.Event()

    def __repr__(self) -> str:
        return f"TorchGraphApi({self._name!r}, capture_error_mode={self.capture_error_mode!r})"


__all__ = [
    "CAPTURE_ERROR_MODE",
    "REQUIRED_NAMES",
    "DeviceGraph",
    "DeviceGraphApi",
    "TorchGraphApi",
    "missing_graph_names",
]
