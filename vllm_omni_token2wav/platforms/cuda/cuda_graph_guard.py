# SPDX-License-Identifier: Apache-2.0
"""The capture guard on vLLM's `CUDAGraphWrapper` (the CUDA twin of the Ascend guard).

After startup vLLM turns capturing off; a descriptor that was never captured and reaches the stock
capture path raises "CUDA graph capturing detected at an inappropriate time", which is fatal for the
engine. With the guard installed such a step runs eager and is counted in `stats()`; captured steps
replay and capture-window steps capture exactly as before. Rule and counters:
`vllm_omni_token2wav.platforms.graph_capture_guard`.

Where it is called: the plugin's `register()` (`patch.apply_engine_patches`) in every engine process
whose platform is CUDA, before the model runner captures graphs. Importing `vllm_omni_token2wav` never
calls it; vllm is imported only inside the installer.
"""

from __future__ import annotations

from typing import Any

from vllm_omni_token2wav.platforms.graph_capture_guard import GuardInstaller

_INSTALLER = GuardInstaller(
    platform="CUDA",
    module="vllm.compilation.cuda_graph",
    class_name="CUDAGraphWrapper",
    entries_attr="concrete_cudagraph_entries",
    graph_attr="cudagraph",
)


def install_into_cuda_graph_wrapper() -> None:
    """Guard `vllm.compilation.cuda_graph.CUDAGraphWrapper.__call__`. Safe to call twice."""
    _INSTALLER.install()


def uninstall_from_cuda_graph_wrapper() -> None:
    """Restore the stock `__call__` (tests)."""
    _INSTALLER.uninstall()


def stats() -> dict[str, Any]:
    """Eager steps taken by the guard: `{"platform", "eager_steps", "by_descriptor"}`."""
    return _INSTALLER.counters.snapshot()


def reset_stats() -> None:
    _INSTALLER.counters.reset()
