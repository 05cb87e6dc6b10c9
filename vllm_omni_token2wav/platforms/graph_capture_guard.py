# SPDX-License-Identifier: Apache-2.0
"""Skip the stock graph-wrapper call only for steps that would otherwise run eager or crash.

vLLM's `CUDAGraphWrapper.__call__` and vllm-ascend's `ACLGraphWrapper.__call__` both capture lazily:
during the runner's capture window the stock call is where a piecewise graph gets captured, and
afterwards it replays. An earlier static-shape patch bypassed the stock call whenever no KV-capacity
bucket was active, so nothing was ever captured and every decode step ran eager (~65 ms instead of
~25 ms) while the runner still reported PIECEWISE. This guard calls the runnable directly only when
ALL of these hold (anything else goes to the stock call unchanged):

1. a forward context is available, its `cudagraph_runtime_mode` is not NONE and equals the
   wrapper's `runtime_mode` (otherwise the stock call runs eager itself);
2. capturing is disabled right now: `monitor.cudagraph_capturing_enabled`, read live through the
   module object (`from ... import cudagraph_capturing_enabled` would freeze the import-time value);
3. the step's batch descriptor has no entry, or its entry has no graph. The stock call creates the
   entry *before* validating, so a failed stock call leaves an empty entry: "key missing" alone
   would raise again on the next call.

With a static-shape capacity bucket active (`set_static_shape_capacity`), the wrapper's entries
dict is swapped to that capacity's own dict before the check, so the guard and the stock call look
at the same dict and a captured decode step of the active capacity replays.

Each bypass is counted per (descriptor, capacity) and warned about once: it means the step runs
eager. `GuardCounters.snapshot()` exposes the counters to operators.

This module patches nothing: the patches that put `make_guarded_call` on the wrappers are
`patch/worker/patch_cuda_graph_wrapper.py` and `patch/worker/patch_acl_graph_wrapper.py` (through
`patch/graph_guard_installer.py`), which bind vLLM's symbols once at install time, because this call
sits on the replay hot path (once per piecewise segment per step).
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

GUARD_MARKER = "_vllm_omni_capture_guard"
_BY_CAPACITY_ATTR = "_vllm_omni_entries_by_capacity"

# Process-wide: a serving process has one active KV-capacity bucket at a time, set by the
# static-shape decode path on the runner thread and read by every wrapper of the model.
_capacity_lock = threading.Lock()
_active_capacity: int | None = None
# True once any capacity was set in this process. Until then no wrapper has per-capacity dicts, so
# the hot path can skip `resolve_entries` entirely (one global read instead of a function call).
_capacity_ever_set = False


def set_static_shape_capacity(capacity: int) -> None:
    """Make `capacity` the active KV-capacity bucket (wrappers use its own entries dict)."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        raise ValueError(f"static-shape capacity must be a positive int, got {capacity!r}")
    global _active_capacity, _capacity_ever_set
    with _capacity_lock:
        _capacity_ever_set = True
        _active_capacity = capacity


def clear_static_shape_capacity() -> None:
    """Leave static-shape decode: wrappers go back to their default entries dict."""
    global _active_capacity
    with _capacity_lock:
        _active_capacity = None


def current_static_shape_capacity() -> int | None:
    return _active_capacity


@dataclass
class GuardCounters:
    """Eager steps the guard took instead of the stock call, per (descriptor, capacity)."""

    platform: str
    by_descriptor: dict[tuple[Any, int | None], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, descriptor: Any, capacity: int | None) -> bool:
        """Count one bypass; True when it is the first for this key (caller warns once)."""
        key = (descriptor, capacity)
        with self.lock:
            count = self.by_descriptor.get(key, 0) + 1
            self.by_descriptor[key] = count
        return count == 1

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            items = dict(self.by_descriptor)
        return {
            "platform": self.platform,
            "eager_steps": sum(items.values()),
            "by_descriptor": {f"{desc!r}@capacity={cap}": n for (desc, cap), n in items.items()},
        }

    def reset(self) -> None:
        with self.lock:
            self.by_descriptor.clear()


def resolve_entries(wrapper: Any, entries_attr: str) -> dict[Any, Any]:
    """The entries dict the stock call will use for this step (capacity-aware; swaps it in place)."""
    by_capacity: dict[int | None, dict[Any, Any]] | None = wrapper.__dict__.get(_BY_CAPACITY_ATTR)
    capacity = _active_capacity
    if by_capacity is None:
        if capacity is None:
            return getattr(wrapper, entries_attr)
        by_capacity = {None: getattr(wrapper, entries_attr)}
        wrapper.__dict__[_BY_CAPACITY_ATTR] = by_capacity
    entries = by_capacity.get(capacity)
    if entries is None:
        entries = by_capacity[capacity] = {}
    if getattr(wrapper, entries_attr) is not entries:
        setattr(wrapper, entries_attr, entries)
    return entries


def make_guarded_call(
    stock_call: Callable[..., Any],
    *,
    entries_attr: str,
    graph_attr: str,
    mode_none: Any,
    get_forward_context: Callable[[], Any],
    monitor: Any,
    counters: GuardCounters,
) -> Callable[..., Any]:
    """Build the patched `__call__` around `stock_call` (see the module docstring for the rule).

    The conditions are a pure conjunction of reads, so they are tested cheapest-first and the first
    one that fails hands the step to the stock call: the capture flag (one attribute read) settles
    capture-window steps, the mode check settles eager steps, and a replay step costs one dict
    `.get` on its descriptor plus one attribute read on the entry. The guard never replays itself:
    the stock replay (input-address checks, syncs, version-specific details) stays the stock code's.
    """
    get_entries = operator.attrgetter(entries_attr)
    get_graph = operator.attrgetter(graph_attr)

    # `self` travels inside `args`: re-splatting `(self, *args)` into the stock call would build a
    # new tuple per call, measurably the largest single cost of a pass-through wrapper.
    def guarded_call(*args: Any, **kwargs: Any) -> Any:
        self = args[0]
        if _capacity_ever_set:
            # Swap in the active capacity's dict first, so that a capture-window step captures into
            # it and the stock call and the check below see the same entries.
            resolve_entries(self, entries_attr)
        if monitor.cudagraph_capturing_enabled:  # read live: the runner flips it after capture
            return stock_call(*args, **kwargs)
        # One call instead of `is_forward_context_available()` + `get_forward_context()`: vLLM's getter
        # asserts a context is set (and returns None under `python -O`). Without one the stock call
        # decides, as before: eager on CUDA, the stock assertion on ACL.
        try:
            context = get_forward_context()
        except AssertionError:
            return stock_call(*args, **kwargs)
        if context is None:
            return stock_call(*args, **kwargs)
        mode = context.cudagraph_runtime_mode
        if mode is mode_none or mode != self.runtime_mode:
            return stock_call(*args, **kwargs)
        descriptor = context.batch_descriptor
        entry = get_entries(self).get(descriptor)
        if entry is not None and get_graph(entry) is not None:
            return stock_call(*args, **kwargs)  # captured: the stock call replays
        capacity = _active_capacity
        if counters.record(descriptor, capacity):
            logger.warning(
                "%s graph for %r (capacity %s) was not captured in the capture window; running it eager",
                counters.platform,
                descriptor,
                capacity,
            )
        return self.runnable(*args[1:], **kwargs)

    setattr(guarded_call, GUARD_MARKER, True)
    guarded_call.__wrapped__ = stock_call  # type: ignore[attr-defined]
    guarded_call.__name__ = "__call__"
    guarded_call.__qualname__ = getattr(stock_call, "__qualname__", "__call__")
    return guarded_call


def is_guarded(call: Any) -> bool:
    return bool(getattr(call, GUARD_MARKER, False))
