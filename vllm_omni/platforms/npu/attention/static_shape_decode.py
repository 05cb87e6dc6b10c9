# SPDX-License-Identifier: Apache-2.0
"""Static-shape decode on Ascend: the capacity buckets and the ACL graph capture guard.

`install_into_ascend_aclgraph()` patches `vllm_ascend.compilation.acl_graph.ACLGraphWrapper.__call__`
with the guard of `vllm_omni.platforms.graph_capture_guard`: the stock call (which captures in the
capture window and replays afterwards) runs unless the step would reach capture outside the window;
only then the runnable runs eager, counted in `stats()`. This replaces an earlier patch that skipped
the stock call whenever no capacity was active, which silently disabled piecewise capture.

Where it is called: the NPU worker calls `install_into_ascend_aclgraph()` once, before the model
runner captures graphs (before `capture_model`). Importing `vllm_omni` never calls it; this module
imports vllm / vllm_ascend / torch_npu only inside the install function.
"""

from __future__ import annotations

from typing import Any

from vllm_omni.platforms.graph_capture_guard import (
    GuardCounters,
    bind_vllm_symbols,
    clear_static_shape_capacity,
    current_static_shape_capacity,
    is_guarded,
    make_guarded_call,
    set_static_shape_capacity,
)

__all__ = [
    "clear_static_shape_capacity",
    "current_static_shape_capacity",
    "install_into_ascend_aclgraph",
    "set_static_shape_capacity",
    "stats",
    "uninstall_from_ascend_aclgraph",
]

_COUNTERS = GuardCounters(platform="ACL")
_ORIGINAL_CALL: Any = None


def install_into_ascend_aclgraph() -> None:
    """Guard `ACLGraphWrapper.__call__` (see the module docstring). Safe to call twice."""
    global _ORIGINAL_CALL
    from vllm_ascend.compilation import acl_graph

    wrapper_cls = acl_graph.ACLGraphWrapper
    if is_guarded(wrapper_cls.__call__):
        return
    mode_none, get_forward_context, is_available, monitor = bind_vllm_symbols()
    _ORIGINAL_CALL = wrapper_cls.__call__
    wrapper_cls.__call__ = make_guarded_call(
        _ORIGINAL_CALL,
        entries_attr="concrete_aclgraph_entries",
        graph_attr="aclgraph",
        mode_none=mode_none,
        get_forward_context=get_forward_context,
        is_forward_context_available=is_available,
        monitor=monitor,
        counters=_COUNTERS,
    )


def uninstall_from_ascend_aclgraph() -> None:
    """Restore the stock `__call__` (tests)."""
    global _ORIGINAL_CALL
    if _ORIGINAL_CALL is None:
        return
    from vllm_ascend.compilation import acl_graph

    if is_guarded(acl_graph.ACLGraphWrapper.__call__):
        acl_graph.ACLGraphWrapper.__call__ = _ORIGINAL_CALL
    _ORIGINAL_CALL = None


def stats() -> dict[str, Any]:
    """Eager steps taken by the guard: `{"platform", "eager_steps", "by_descriptor"}`."""
    return _COUNTERS.snapshot()


def reset_stats() -> None:
    _COUNTERS.reset()
