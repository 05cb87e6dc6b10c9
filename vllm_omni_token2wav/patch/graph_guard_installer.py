# SPDX-License-Identifier: Apache-2.0
"""Install / uninstall the graph-capture guard on one upstream graph-wrapper class (shared by two patches).

Not a patch itself: `worker/patch_cuda_graph_wrapper.py` (vLLM's `CUDAGraphWrapper`) and
`worker/patch_acl_graph_wrapper.py` (vLLM-Ascend's `ACLGraphWrapper`) each own one `GuardInstaller` naming
their class. The rule the patched `__call__` follows is `platforms/graph_capture_guard.py` (`make_guarded_call`).

Before it touches the class, `install()` checks (`checks.py`) that the wrapper and the vLLM symbols the guard
binds are what the guard was written for: the class exists, `__call__` takes `(self, *args, **kwargs)`,
`__init__` takes `(self, runnable, vllm_config, runtime_mode, ...)` (the guard reads `self.runnable` and
`self.runtime_mode`), `vllm.compilation.monitor.cudagraph_capturing_enabled` exists (read live on every
step), `vllm.forward_context.get_forward_context` is callable and `vllm.config.CUDAGraphMode.NONE` exists.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from vllm_omni_token2wav.patch.checks import expect_attribute, expect_callable, expect_class, resolve
from vllm_omni_token2wav.patch.register import PatchEntry
from vllm_omni_token2wav.platforms.graph_capture_guard import GuardCounters, is_guarded, make_guarded_call

__all__ = ["GuardInstaller", "bind_vllm_symbols"]


def bind_vllm_symbols(row: PatchEntry) -> tuple[Any, Callable[[], Any], Any]:
    """(CUDAGraphMode.NONE, get_forward_context, the monitor module), each checked against `row`'s version."""
    patch, version = row.module, row.written_against
    monitor = resolve(patch, version, "vllm.compilation.monitor")
    expect_attribute(patch, version, monitor, "vllm.compilation.monitor", "cudagraph_capturing_enabled")
    get_forward_context = expect_callable(
        patch,
        version,
        "vllm.forward_context.get_forward_context",
        resolve(patch, version, "vllm.forward_context.get_forward_context"),
    )
    mode = resolve(patch, version, "vllm.config.CUDAGraphMode")
    mode_none = expect_attribute(patch, version, mode, "vllm.config.CUDAGraphMode", "NONE")
    return mode_none, get_forward_context, monitor


class GuardInstaller:
    """Install / uninstall the guard on one wrapper class, named by module path (imported lazily).

    It remembers every class it patched together with that class's stock `__call__`, and
    `uninstall()` restores those classes themselves rather than whatever the module path resolves
    to at that moment: a test that swaps the module (fake vllm vs the real one) cannot make it
    restore the wrong class or leave a patched one behind.
    """

    def __init__(self, *, row: PatchEntry, platform: str, entries_attr: str, graph_attr: str) -> None:
        self.row = row
        # row.target is "<module>.<Class>.__call__"
        self.module, self.class_name = row.target.removesuffix(".__call__").rsplit(".", 1)
        self.entries_attr = entries_attr
        self.graph_attr = graph_attr
        self.counters = GuardCounters(platform=platform)
        self._patched: dict[type, Callable[..., Any]] = {}
        self._lock = threading.Lock()

    def _wrapper_cls(self) -> type:
        """The wrapper class, checked: it exists and `__init__` / `__call__` have the shapes the guard needs."""
        patch, version = self.row.module, self.row.written_against
        dotted = f"{self.module}.{self.class_name}"
        wrapper_cls = expect_class(patch, version, dotted, resolve(patch, version, dotted))
        if is_guarded(wrapper_cls.__call__):
            return wrapper_cls  # installed already (checked then)
        expect_callable(patch, version, f"{dotted}.__call__", wrapper_cls.__call__, parameters=("self",), var_args=True)
        expect_callable(
            patch,
            version,
            f"{dotted}.__init__",
            wrapper_cls.__init__,
            parameters=("self", "runnable", "vllm_config", "runtime_mode"),
        )
        return wrapper_cls

    def install(self) -> None:
        with self._lock:
            wrapper_cls = self._wrapper_cls()
            stock_call = wrapper_cls.__call__
            if is_guarded(stock_call):
                return
            mode_none, get_forward_context, monitor = bind_vllm_symbols(self.row)
            self._patched[wrapper_cls] = stock_call
            wrapper_cls.__call__ = make_guarded_call(  # type: ignore[method-assign]
                stock_call,
                entries_attr=self.entries_attr,
                graph_attr=self.graph_attr,
                mode_none=mode_none,
                get_forward_context=get_forward_context,
                monitor=monitor,
                counters=self.counters,
            )

    def uninstall(self) -> None:
        with self._lock:
            for wrapper_cls, stock_call in self._patched.items():
                if is_guarded(wrapper_cls.__call__):
                    wrapper_cls.__call__ = stock_call  # type: ignore[method-assign]
            self._patched.clear()
