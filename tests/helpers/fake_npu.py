# SPDX-License-Identifier: Apache-2.0
"""A stand-in `torch_npu` for CPU tests: the real one cannot be imported without Ascend CANN.

`install_fake_torch_npu(monkeypatch, available=True)` registers a `torch_npu` module and a
`torch.npu` device module whose `is_available()` answers as told; `install_broken_torch_npu`
puts a `torch_npu` package on `sys.path` whose import fails the way it does on a host without
CANN (`ImportError: libhccl.so: cannot open shared object file`).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

BROKEN_IMPORT_MESSAGE = "libhccl.so: cannot open shared object file: No such file or directory"


class FakeNpuModule(types.ModuleType):
    """What the platform layer uses of `torch.npu`."""

    def __init__(self, available: bool, count: int = 1) -> None:
        super().__init__("torch.npu")
        self._available = available
        self._count = count
        self.synchronize_calls = 0

    def is_available(self) -> bool:
        return self._available

    def device_count(self) -> int:
        return self._count if self._available else 0

    def current_device(self) -> int:
        return 0

    def get_device_name(self, index: int | None = None) -> str:
        return "Ascend910B2 (fake)"

    def synchronize(self, device: object = None) -> None:
        self.synchronize_calls += 1


def install_fake_torch_npu(monkeypatch: pytest.MonkeyPatch, *, available: bool = True, count: int = 1) -> FakeNpuModule:
    module = FakeNpuModule(available, count)
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    monkeypatch.setattr(torch, "npu", module, raising=False)
    return module


def install_broken_torch_npu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    package = tmp_path / "broken_site" / "torch_npu"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"raise ImportError({BROKEN_IMPORT_MESSAGE!r})\n")
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.syspath_prepend(str(package.parent))
