# SPDX-License-Identifier: Apache-2.0
"""Count the places a device path would wait for the device: a fake device for CPU tests.

On CUDA / NPU a host synchronisation stalls the launching thread until the queued kernels finish,
so a serving path that syncs mid-way loses the overlap of host and device work (and cannot be
captured into a graph). CPU tensors hide every such point, so `HostSyncCounter` runs the path on
the `meta` device, where tensors have shapes but no values, and records (it does not raise) every
operation that would need the device's values or its queue drained:

| what                               | how it shows up                                           |
|------------------------------------|-----------------------------------------------------------|
| `.item()`, `int()` / `float()` /   | `aten._local_scalar_dense`, `aten.is_nonzero`             |
| `bool()` of a tensor, `if tensor:` |                                                           |
| `torch.equal`                      | `aten.equal`                                              |
| data-dependent shapes              | `aten.nonzero`, `masked_select`, `unique*`                |
| device -> host copies              | `_to_copy` / `copy_` from `meta` to `cpu` (`.cpu()`)      |
| blocking host -> device copies     | `_to_copy` / `copy_` from `cpu` to `meta` without         |
|                                    | `non_blocking` (`.to(d)`), and `torch.tensor` /           |
|                                    | `torch.as_tensor(data, device=d)` (TorchFunctionMode: the |
|                                    | copy runs below the dispatcher): a pageable copy waits    |
|                                    | for the stream to drain                                   |
| Python reads of tensor data        | `Tensor.tolist`, `numpy`, `__array__` (TorchFunctionMode) |

Each record names the operation and the innermost `vllm_omni_token2wav` frame that issued it. The recorded
operation returns a stand-in (zeros / 1 / a CPU tensor of the right shape) so the run continues and
every site is listed, not just the first.

Limits: values are fake, so code whose control flow depends on them follows one branch; the counts
are of operations, not of distinct host waits (two `.item()` in a row are one wait on a device).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_SCALAR_OPS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.item.default,
    torch.ops.aten.is_nonzero.default,
    torch.ops.aten.equal.default,
}
_DYNAMIC_SHAPE_OPS = {
    torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten._unique2.default,
    torch.ops.aten.unique_dim.default,
    torch.ops.aten.unique_consecutive.default,
}
_COPY_OPS = {torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default}
_PYTHON_READS = {"tolist", "numpy", "__array__"}
_HOST_DATA_TO_DEVICE = {"tensor", "as_tensor"}


@dataclass(frozen=True)
class SyncSite:
    """One recorded host synchronisation: what, and the innermost project frame that did it."""

    kind: str  # "scalar", "dynamic-shape", "device-to-host", "blocking-host-to-device", "python-read"
    op: str
    where: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.op} at {self.where}"


def _caller() -> str:
    frames = [
        f for f in traceback.extract_stack() if "vllm_omni_token2wav" in f.filename and "/tests/" not in f.filename
    ]
    if not frames:
        return "<outside vllm_omni_token2wav>"
    f = frames[-1]
    return f"{f.filename.rsplit('vllm_omni_token2wav', 1)[-1].lstrip('/')}:{f.lineno} ({f.name})"


def _device(value: Any) -> torch.device | None:
    if isinstance(value, torch.Tensor):
        return value.device
    if value is None:
        return None
    return torch.device(value)


class _DispatchCounter(TorchDispatchMode):
    def __init__(self, sites: list[SyncSite]) -> None:
        super().__init__()
        self.sites = sites
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        self.ops += 1
        name = str(func)
        on_device = any(isinstance(a, torch.Tensor) and a.is_meta for a in args)
        if func in _SCALAR_OPS and on_device:  # host tensors read on the host are no synchronisation
            self.sites.append(SyncSite("scalar", name, _caller()))
            if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default):
                source = args[0]
                return True if source.dtype == torch.bool else (1 if not source.is_floating_point() else 1.0)
            return True
        if func in _DYNAMIC_SHAPE_OPS and on_device:
            self.sites.append(SyncSite("dynamic-shape", name, _caller()))
            stand_ins = [
                torch.zeros(a.shape, dtype=a.dtype) if isinstance(a, torch.Tensor) and a.is_meta else a for a in args
            ]
            return func(*stand_ins, **kwargs)
        if func in _COPY_OPS:
            if func is torch.ops.aten._to_copy.default:  # _to_copy(self, *, dtype, device, non_blocking, ...)
                source, target = args[0], _device(kwargs.get("device")) or args[0].device
                non_blocking = bool(kwargs.get("non_blocking", False))
            else:  # copy_(self, src, non_blocking=False)
                source, target = args[1], args[0].device
                non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
            if source.device.type == "meta" and target.type == "cpu":
                self.sites.append(SyncSite("device-to-host", name, _caller()))
                if func is torch.ops.aten._to_copy.default:
                    return torch.zeros(source.shape, dtype=kwargs.get("dtype") or source.dtype)
                return args[0]
            if source.device.type == "cpu" and target.type == "meta" and not non_blocking:
                # torch.tensor(data, device=d) and tensor.to(d) copy pageable memory and wait for the stream
                self.sites.append(SyncSite("blocking-host-to-device", name, _caller()))
        return func(*args, **kwargs)


class _FunctionCounter(TorchFunctionMode):
    def __init__(self, sites: list[SyncSite]) -> None:
        super().__init__()
        self.sites = sites

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _HOST_DATA_TO_DEVICE and _device(kwargs.get("device")) not in (None, torch.device("cpu")):
            data = args[0] if args else kwargs.get("data")
            if not (isinstance(data, torch.Tensor) and data.is_meta):
                # torch.tensor(data, device=d) builds on the host and copies below the dispatcher (unseen
                # by the dispatch mode): a blocking pageable copy, caught here at the Python call
                self.sites.append(SyncSite("blocking-host-to-device", f"torch.{name}", _caller()))
        if name in _PYTHON_READS and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
            self.sites.append(SyncSite("python-read", f"Tensor.{name}", _caller()))
            placeholder = torch.zeros(args[0].shape, dtype=args[0].dtype)
            return func(placeholder, *args[1:], **kwargs)
        return func(*args, **kwargs)


class HostSyncCounter:
    """`with HostSyncCounter() as syncs: path_on_meta()` then `syncs.sites` (see the module docstring)."""

    def __init__(self) -> None:
        self.sites: list[SyncSite] = []
        self._dispatch = _DispatchCounter(self.sites)
        self._function = _FunctionCounter(self.sites)

    @property
    def ops(self) -> int:
        """aten operations seen (a guard against a counter that intercepts nothing)."""
        return self._dispatch.ops

    def __enter__(self) -> HostSyncCounter:
        self._function.__enter__()
        self._dispatch.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._dispatch.__exit__(*exc)
        self._function.__exit__(*exc)

    def report(self) -> str:
        return "\n".join(str(s) for s in self.sites) or "(no host synchronisation)"


__all__ = ["HostSyncCounter", "SyncSite"]
