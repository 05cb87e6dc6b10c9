# SPDX-License-Identifier: Apache-2.0
"""The graph-capture guard on vLLM-Ascend's `ACLGraphWrapper.__call__` (register row: `worker.patch_acl_graph_wrapper`).

`install()` patches `vllm_ascend.compilation.acl_graph.ACLGraphWrapper.__call__` with the guard of
`vllm_omni_token2wav/platforms/graph_capture_guard.py`: the stock call (which captures in the capture window and
replays afterwards) runs unless the step would reach capture outside the window; only then the runnable runs
eager, counted in `stats()`. This replaces an earlier patch that skipped the stock call whenever no
static-shape capacity was active, which silently disabled piecewise capture. The static-shape capacity
buckets themselves (`set_static_shape_capacity` and friends) are the guard's: `platforms/graph_capture_guard.py`.

Who installs it: nothing in vLLM-Ascend's NPU worker. The plugin's `register()` calls
`patch.apply_engine_patches()`, which calls `install()` in every process that loads our general plugins
(vLLM and vLLM-Omni load them in every process they start, the NPU workers included, before the model
runner's `capture_model`) where `vllm_ascend.compilation.acl_graph` imports. Importing `vllm_omni_token2wav`
never calls it; vllm / vllm_ascend / torch_npu are imported only inside `install()`.
"""

from __future__ import annotations

from typing import Any

from vllm_omni_token2wav.patch.graph_guard_installer import GuardInstaller
from vllm_omni_token2wav.patch.register import entry

__all__ = ["ROW", "install", "reset_stats", "stats", "uninstall"]

ROW = entry(__name__)

_INSTALLER = GuardInstaller(row=ROW, platform="ACL", entries_attr="concrete_aclgraph_entries", graph_attr="aclgraph")


def install() -> None:
    """Guard `ACLGraphWrapper.__call__` (checked first; see the module docstring). Safe to call twice."""
    _INSTALLER.install()


def uninstall() -> None:
    """Restore the stock `__call__` (tests)."""
    _INSTALLER.uninstall()


def stats() -> dict[str, Any]:
    """Eager steps taken by the guard: `{"platform", "eager_steps", "by_descriptor"}`."""
    return _INSTALLER.counters.snapshot()


def reset_stats() -> None:
    _INSTALLER.counters.reset()
