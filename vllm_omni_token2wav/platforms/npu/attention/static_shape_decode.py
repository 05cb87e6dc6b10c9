# SPDX-License-Identifier: Apache-2.0
"""Static-shape decode on Ascend: the capacity buckets and the ACL graph capture guard.

`install_into_ascend_aclgraph()` patches `vllm_ascend.compilation.acl_graph.ACLGraphWrapper.__call__`
with the guard of `vllm_omni_token2wav.platforms.graph_capture_guard`: the stock call (which captures in the
capture window and replays afterwards) runs unless the step would reach capture outside the window;
only then the runnable runs eager, counted in `stats()`. This replaces an earlier patch that skipped
the stock call whenever no capacity was active, which silently disabled piecewise capture.

Where it is called: the plugin's `register()` (`patch.apply_engine_patches`) in every engine process
where vLLM-Ascend imports, before the model runner captures graphs (before `capture_model`). Importing
`vllm_omni_token2wav` never calls it; this module imports vllm / vllm_ascend / torch_npu only inside the
install function.
"""

from __future__ import annotations

from typing import Any

from vllm_omni_token2wav.platforms.graph_capture_guard import (
    GuardInstaller,
    clear_static_shape_capacity,
    current_static_shape_capacity,
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

_INSTALLER = GuardInstaller(
    platform="ACL",
    module="vllm_ascend.compilation.acl_graph",
    class_name="ACLGraphWrapper",
    entries_attr="concrete_aclgraph_entries",
    graph_attr="aclgraph",
)


def install_into_ascend_aclgraph() -> None:
    """Guard `ACLGraphWrapper.__call__` (see the module docstring). Safe to call twice."""
    _INSTALLER.install()


def uninstall_from_ascend_aclgraph() -> None:
    """Restore the stock `__call__` (tests)."""
    _INSTALLER.uninstall()


def stats() -> dict[str, Any]:
    """Eager steps taken by the guard: `{"platform", "eager_steps", "by_descriptor"}`."""
    return _INSTALLER.counters.snapshot()


def reset_stats() -> None:
    _INSTALLER.counters.reset()
