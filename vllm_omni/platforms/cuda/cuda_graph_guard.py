# SPDX-License-Identifier: Apache-2.0
"""The capture guard on vLLM's `CUDAGraphWrapper` (the CUDA twin of the Ascend guard).

After startup vLLM turns capturing off; a descriptor that was never captured and reaches the stock
capture path raises "CUDA graph capturing detected at an inappropriate time", which is fatal for the
engine. With the guard installed such a step runs eager and is counted in `stats()`; captured steps
replay and capture-window steps capture exactly as before. Rule and counters:
`vllm_omni.platforms.graph_capture_guard`.

Where it is called: the CUDA worker calls `install_into_cuda_graph_wrapper()` once before
`capture_model`. Importing `vllm_omni` never calls it; vllm is imported only inside the installer.
"""

from __future__ import annotations

from typing import Any

from vllm_omni.platforms.graph_capture_guard import GuardCounters, bind_vllm_symbols, is_guarded, make_guarded_call

_COUNTERS = GuardCounters(platform="CUDA")
_ORIGINAL_CALL: Any = None


def install_into_cuda_graph_wrapper() -> None:
    """Guard `vllm.compilation.cuda_graph.CUDAGraphWrapper.__call__`. Safe to call twice."""
    global _ORIGINAL_CALL
    from vllm.compilation import cuda_graph

    wrapper_cls = cuda_graph.CUDAGraphWrapper
    if is_guarded(wrapper_cls.__call__):
        return
    mode_none, get_forward_context, is_available, monitor = bind_vllm_symbols()
    _ORIGINAL_CALL = wrapper_cls.__call__
    wrapper_cls.__call__ = make_guarded_call(
        _ORIGINAL_CALL,
        entries_attr="concrete_cudagraph_entries",
        graph_attr="cudagraph",
        mode_none=mode_none,
        get_forward_context=get_forward_context,
        is_forward_context_available=is_available,
        monitor=monitor,
        counters=_COUNTERS,
    )


def uninstall_from_cuda_graph_wrapper() -> None:
    """Restore the stock `__call__` (tests)."""
    global _ORIGINAL_CALL
    if _ORIGINAL_CALL is None:
        return
    from vllm.compilation import cuda_graph

    if is_guarded(cuda_graph.CUDAGraphWrapper.__call__):
        cuda_graph.CUDAGraphWrapper.__call__ = _ORIGINAL_CALL
    _ORIGINAL_CALL = None


def stats() -> dict[str, Any]:
    return _COUNTERS.snapshot()


def reset_stats() -> None:
    _COUNTERS.reset()
