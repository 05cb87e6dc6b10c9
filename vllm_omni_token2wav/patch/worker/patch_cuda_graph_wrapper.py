# SPDX-License-Identifier: Apache-2.0
"""The graph-capture guard on vLLM's `CUDAGraphWrapper.__call__` (register row: `worker.patch_cuda_graph_wrapper`).

After startup vLLM turns capturing off; a descriptor that was never captured and reaches the stock
capture path raises "CUDA graph capturing detected at an inappropriate time", which is fatal for the
engine. With the guard installed such a step runs eager and is counted in `stats()`; captured steps
replay and capture-window steps capture exactly as before. Rule and counters:
`vllm_omni_token2wav/platforms/graph_capture_guard.py`; install-time checks: `patch/graph_guard_installer.py`.

Who installs it: nothing in vLLM's CUDA worker. The plugin's `register()` calls `patch.apply_engine_patches()`,
which calls `install()` in every process that loads our general plugins (vLLM and vLLM-Omni load them in
every process they start, the GPU workers included, before the model runner captures graphs) whose
platform object says CUDA (`platforms.current_omni_platform.is_cuda()`) and where
`vllm.compilation.cuda_graph` imports. Importing `vllm_omni_token2wav` never calls it; vllm is imported only
inside the installer.
"""

from __future__ import annotations

from typing import Any

from vllm_omni_token2wav.patch.graph_guard_installer import GuardInstaller
from vllm_omni_token2wav.patch.register import entry

__all__ = ["ROW", "install", "reset_stats", "stats", "uninstall"]

ROW = entry(__name__)

_INSTALLER = GuardInstaller(row=ROW, platform="CUDA", entries_attr="concrete_cudagraph_entries", graph_attr="cudagraph")


def install() -> None:
    """Guard `vllm.compilation.cuda_graph.CUDAGraphWrapper.__call__` (checked first). Safe to call twice."""
    _INSTALLER.install()


def uninstall() -> None:
    """Restore the stock `__call__` (tests)."""
    _INSTALLER.uninstall()


def stats() -> dict[str, Any]:
    """Eager steps taken by the guard: `{"platform", "eager_steps", "by_descriptor"}`."""
    return _INSTALLER.counters.snapshot()


def reset_stats() -> None:
    _INSTALLER.counters.reset()
