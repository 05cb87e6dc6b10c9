# SPDX-License-Identifier: Apache-2.0
"""Capture a device callable once per input shape and replay it: CUDA graphs, NPU graphs, eager elsewhere.

Eager PyTorch on an accelerator is launch-bound for the Token2Wav stage's networks: CAM++ costs
~11 MFLOP per frame, a few microseconds of H200 compute at T=200 behind hundreds of kernel launches,
and the flow estimator and HiFT are launch-bound the same way at streaming chunk sizes. A captured
graph replays the whole recorded kernel sequence with one launch. `DeviceGraphRunner` is the one
helper CAM++, the flow estimator and HiFT use for that; `platforms.graph_api` says what it needs
from a platform, and the platform object supplies it (`DevicePlatform.device_graph_api()`).

    runner = DeviceGraphRunner(model_forward, name="campplus", device=device)
    out = runner(feats)              # first call of a shape: warm up, capture, replay; later: replay

The rules (docs/design/device_graphs.md has the reasoning and the device-check command):

Keys. A graph is recorded for one key: the shape and dtype of every positional tensor argument
(`fn(*tensors)`; bind Python values with `functools.partial`, a graph cannot see them). Callers pad
their inputs to the buckets of `model_executor/buckets.py` so the number of keys stays small. At
most `max_graphs` graphs are kept (`VLLM_OMNI_TOKEN2WAV_DEVICE_GRAPHS_MAX`, default 64); capturing one more
evicts the least recently used.

Capture. Lazily on the first call of a key (with `capture_after=n`, on its n-th call, so a shape
seen once stays eager; or only at `warmup(*example)` with `lazy=False`): the
arguments are copied into static input buffers owned by the runner, `fn` runs `warmup_iters` times
eagerly on a side stream (lazy initialisation and allocator warm-up must not happen inside a capture),
then once inside the capture. All graphs of one runner share one memory pool and one side stream
(torch's pool-sharing rule). Capture happens with grad off and outside inference mode, so static
buffers and outputs are normal tensors: a static buffer allocated inside `inference_mode` would be
an inference tensor, and copying the next call's input into it outside inference mode raises.

Replay. The arguments are copied into the key's static buffers, the graph is replayed on the
caller's current stream, and the outputs are cloned (`clone_outputs=True`, the default). With
`clone_outputs=False` the caller gets the static output tensors themselves: they are overwritten by
the next call of the same key, so consume them (or copy them) before calling again.

Correctness. With `verify=True` (default) the first replay of a new graph is compared with the eager
warm-up run on the same inputs (`allclose`, rtol 1e-4, atol 1e-5); a mismatch counts as a failed
capture. A failed capture (an exception while capturing, or a mismatch) is logged once per runner,
counted, and its key runs eagerly from then on; after `MAX_FAILURES` failures the runner captures
no new keys (its existing graphs keep replaying). An exception during the eager warm-up is `fn`'s
own error and propagates.

Thread safety. One capture at a time per process (`_CAPTURE_LOCK`: torch allows one capture in
flight per process), one capture per key (a lock per key; concurrent first callers of a key wait for
it and then replay), replays of one runner serialised (a runner lock covers copy-in, replay and
clone-out, and an event chain orders them on the device when callers use different streams).
Captures use the `thread_local` capture mode, so eager work on other threads cannot invalidate them.

Switch and counters. `enabled=False`, `VLLM_OMNI_TOKEN2WAV_DEVICE_GRAPHS=0`, a CPU device or a platform
without a graph API make the runner call `fn(*args)` unchanged. `counters()` returns captures,
replays, eager fallbacks, evictions, failures and capture time (`all_graph_counters()` for every
runner of the process, for benchmarks); captures, evictions and failures are logged.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Generic, TypeVar

import torch

from vllm_omni_token2wav import envs
from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.platforms.device import DeviceSpec, normalize_device
from vllm_omni_token2wav.platforms.graph_api import DeviceGraph, DeviceGraphApi

logger = init_logger(__name__)

T = TypeVar("T")
GraphKey = tuple[tuple[tuple[int, ...], torch.dtype], ...]

#: Failed captures after which a runner stops trying (a network that cannot be captured fails at every key).
MAX_FAILURES: Final = 3
#: `verify` tolerance of the first replay against the eager warm-up on the same inputs.
VERIFY_RTOL: Final = 1e-4
VERIFY_ATOL: Final = 1e-5
#: Keys remembered as failed per runner, as a multiple of `max_graphs` (bounded like the graphs).
_FAILED_KEYS_FACTOR: Final = 4

# Process-wide: torch supports one graph capture in flight per process (the caching allocator routes
# the capturing stream's allocations into the capture's pool; torch_npu shares one default capture
# stream), so every runner of the process captures under this lock.
_CAPTURE_LOCK = threading.Lock()

# Process-wide registry so benchmarks and operators can read every live runner's counters.
_registry_lock = threading.Lock()
_registry: weakref.WeakSet[DeviceGraphRunner[Any]] = weakref.WeakSet()


class _FromPlatform:
    """Sentinel: ask the serving platform for its graph API."""

    def __repr__(self) -> str:
        return "FROM_PLATFORM"


FROM_PLATFORM: Final = _FromPlatform()


class _CaptureError(Exception):
    """A capture (or its verification) failed; the key runs eagerly."""


@dataclass(frozen=True)
class GraphCounters:
    """A snapshot of one runner's bookkeeping (`DeviceGraphRunner.counters()`)."""

    name: str
    backend: str  # the graph API's name, or "eager"
    disabled_reason: str | None  # why graphs are off (None while the runner captures)
    capture_stopped: str | None  # why no new keys are captured (too many failures), else None
    graphs: int  # live graphs now
    max_graphs: int
    captures: int
    replays: int
    eager_fallbacks: int  # calls that ran eagerly although graphs are on (failed or uncaptured key)
    disabled_calls: int  # calls that ran eagerly because graphs are off
    evictions: int
    failures: int
    capture_ms: float  # total time spent warming up, capturing and verifying
    eager_reasons: dict[str, int] = field(default_factory=dict)
    last_failure: str | None = None  # the shape and reason of the latest failed capture

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        state = self.backend if self.disabled_reason is None else f"eager ({self.disabled_reason})"
        return (
            f"{self.name}: {state}, {self.graphs}/{self.max_graphs} graphs, {self.captures} captures "
            f"({self.capture_ms:.0f} ms), {self.replays} replays, {self.eager_fallbacks} eager fallbacks, "
            f"{self.disabled_calls} disabled calls, {self.evictions} evictions, {self.failures} failures"
        )


@dataclass
class _Tally:
    captures: int = 0
    replays: int = 0
    evictions: int = 0
    failures: int = 0
    disabled_calls: int = 0
    capture_ms: float = 0.0
    eager_reasons: dict[str, int] = field(default_factory=dict)
    last_failure: str | None = None


@dataclass
class _Entry:
    """One captured graph with the buffers its kernels read and write."""

    key: GraphKey
    graph: DeviceGraph
    inputs: tuple[torch.Tensor, ...]
    outputs: Any  # what `fn` returned inside the capture: the tensors every replay overwrites


def describe_key(key: GraphKey) -> str:
    """`[1, 200, 80] float32` style text of a key, for logs."""
    return ", ".join(f"{list(shape)} {str(dtype).removeprefix('torch.')}" for shape, dtype in key)


def _map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return (
            type(obj)(*(_map_tensors(fn, o) for o in obj))
            if hasattr(obj, "_fields")
            else tuple(_map_tensors(fn, o) for o in obj)
        )
    if isinstance(obj, list):
        return [_map_tensors(fn, o) for o in obj]
    if isinstance(obj, dict):
        return {k: _map_tensors(fn, v) for k, v in obj.items()}
    return obj


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, tuple | list):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)


def _mismatch(got: Any, want: Any) -> str | None:
    """None when every tensor of `got` matches `want` within the verify tolerance, else what differs."""
    got_t, want_t = list(_tensors(got)), list(_tensors(want))
    if len(got_t) != len(want_t):
        return f"replay returned {len(got_t)} tensors, eager {len(want_t)}"
    for i, (g, w) in enumerate(zip(got_t, want_t, strict=True)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {i}: replay {list(g.shape)} {g.dtype}, eager {list(w.shape)} {w.dtype}"
        if g.dtype.is_floating_point or g.dtype.is_complex:
            same = torch.allclose(g, w, rtol=VERIFY_RTOL, atol=VERIFY_ATOL, equal_nan=True)
        else:
            same = torch.equal(g, w)
        if not same:
            diff = (g.double() - w.double()).abs().nan_to_num(nan=float("inf")).max().item()
            return f"output {i} {list(g.shape)}: replay differs from eager by up to {diff:.3g}"
    return None


@contextmanager
def _capture_modes() -> Iterator[None]:
    """Grad off and outside inference mode: static buffers and captured outputs are normal tensors."""
    with torch.inference_mode(False), torch.no_grad():
        yield


class DeviceGraphRunner(Generic[T]):
    """`fn(*tensors)` replayed from a device graph per input shape; see the module docstring for the rules.

    Args:
        fn: the device work; takes positional tensors on `device`, returns a tensor or a tuple / list
            / dict of tensors, and must not synchronise with the host (a capture cannot).
        name: label for logs and counters ("campplus", "flow-estimator", "hift").
        device: where `fn` runs (None: the serving device).
        enabled: False turns graphs off; None follows `VLLM_OMNI_TOKEN2WAV_DEVICE_GRAPHS` (default on).
        max_graphs: graphs kept before LRU eviction (None: `VLLM_OMNI_TOKEN2WAV_DEVICE_GRAPHS_MAX`).
        lazy: capture on the first call of a key; False captures only in `warmup()` and runs
            uncaptured keys eagerly (counted).
        capture_after: with `lazy`, capture a key at its `capture_after`-th call; earlier calls run
            eagerly (counted as `below_capture_after`). 1 (default) captures at once; 2 keeps shapes
            that occur once (a stream's last chunk of an odd length) from costing a capture.
        clone_outputs: return clones (default) or the static outputs, overwritten by the next call.
        warmup_iters: eager runs before each capture (at least 1 when `verify`).
        verify: compare the first replay of each graph with the eager warm-up.
        graph_api: the graph runtime; default the serving platform's (`device_graph_api()`), None
            for eager. Tests pass a fake.
    """

    def __init__(
        self,
        fn: Callable[..., T],
        *,
        name: str,
        device: DeviceSpec = None,
        enabled: bool | None = None,
        max_graphs: int | None = None,
        lazy: bool = True,
        capture_after: int = 1,
        clone_outputs: bool = True,
        warmup_iters: int = 2,
        verify: bool = True,
        graph_api: DeviceGraphApi | _FromPlatform | None = FROM_PLATFORM,
    ) -> None:
        if max_graphs is not None and (isinstance(max_graphs, bool) or not isinstance(max_graphs, int)):
            raise ValueError(f"DeviceGraphRunner({name}): max_graphs must be an int >= 1, got {max_graphs!r}")
        if max_graphs is not None and max_graphs < 1:
            raise ValueError(f"DeviceGraphRunner({name}): max_graphs must be >= 1, got {max_graphs}")
        if isinstance(capture_after, bool) or not isinstance(capture_after, int) or capture_after < 1:
            raise ValueError(f"DeviceGraphRunner({name}): capture_after must be an int >= 1, got {capture_after!r}")
        if warmup_iters < 0:
            raise ValueError(f"DeviceGraphRunner({name}): warmup_iters must be >= 0, got {warmup_iters}")
        self.fn = fn
        self.name = name
        self.device = normalize_device(device)
        self.max_graphs = envs.device_graphs_max() if max_graphs is None else max_graphs
        self.lazy = lazy
        self.capture_after = capture_after
        self.clone_outputs = clone_outputs
        self.verify = verify
        self.warmup_iters = max(warmup_iters, 1) if verify else warmup_iters
        self._api, self._disabled_reason = self._resolve_api(enabled, graph_api)
        self._capture_stopped: str | None = None
        self._lock = threading.Lock()  # entries, failed keys, key locks, tally
        self._replay_lock = threading.Lock()  # copy-in -> replay -> clone-out of this runner
        self._entries: OrderedDict[GraphKey, _Entry] = OrderedDict()
        self._failed: OrderedDict[GraphKey, str] = OrderedDict()
        self._seen: OrderedDict[GraphKey, int] = OrderedDict()  # calls of keys not captured yet (capture_after)
        self._key_locks: dict[GraphKey, threading.Lock] = {}
        self._tally = _Tally()
        self._pool: Any = None
        self._side_stream: Any = None
        self._done_event: Any = None
        with _registry_lock:
            _registry.add(self)
        if self._disabled_reason is not None:
            log = logger.debug if self.device.type == "cpu" else logger.info
            log("%s: device graphs off (%s); running eagerly", name, self._disabled_reason)

    # -- configuration -----------------------------------------------------------------------------

    def _resolve_api(
        self, enabled: bool | None, graph_api: DeviceGraphApi | _FromPlatform | None
    ) -> tuple[DeviceGraphApi | None, str | None]:
        if enabled is False:
            return None, "disabled by the caller (enabled=False)"
        if enabled is None and not envs.device_graphs_enabled():
            return None, f"{envs.DEVICE_GRAPHS_ENV}=0"
        if not isinstance(graph_api, _FromPlatform):
            return (graph_api, None) if graph_api is not None else (None, "no graph API given")
        if self.device.type == "cpu":
            return None, "CPU runs eagerly"
        from vllm_omni_token2wav import platforms

        platform = platforms.current_omni_platform
        if platform.device_type != self.device.type:
            return None, f"{self.device} is not on the serving platform ({platform.device_type})"
        api = platform.device_graph_api()
        if api is None:
            return None, f"{platform.device_type} platform has no graph API"
        return api, None

    @property
    def graphs_active(self) -> bool:
        """Whether calls may replay graphs (False: every call runs `fn` eagerly)."""
        return self._api is not None and self._disabled_reason is None

    @property
    def backend(self) -> str:
        return self._api.name if self._api is not None else "eager"

    # -- calls -------------------------------------------------------------------------------------

    def __call__(self, *args: torch.Tensor) -> T:
        if not self.graphs_active:
            with self._lock:
                self._tally.disabled_calls += 1
            return self.fn(*args)
        key = self._key(args)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        if entry is not None:
            return self._replay(entry, args)  # type: ignore[no-any-return]
        captured = self._capture_key(key, args, explicit=False)
        if captured is None:
            return self.fn(*args)
        return captured[1]  # type: ignore[no-any-return]

    def warmup(self, *example: torch.Tensor) -> bool:
        """Capture the graph of `example`'s key now (any `lazy`); True when that key has a graph afterwards.

        `example` should hold realistic values (not zeros) when `verify` is on: the verification
        compares the replay with an eager run on it.
        """
        if not self.graphs_active:
            return False
        key = self._key(example)
        with self._lock:
            if key in self._entries:
                return True
        return self._capture_key(key, example, explicit=True) is not None

    def _key(self, args: tuple[torch.Tensor, ...]) -> GraphKey:
        key = []
        for i, arg in enumerate(args):
            if not isinstance(arg, torch.Tensor):
                raise TypeError(
                    f"{self.name}: argument {i} is a {type(arg).__name__}; graph runners take tensors only "
                    "(bind Python values with functools.partial: a captured graph cannot see them)"
                )
            if arg.device != self.device:
                raise ValueError(
                    f"{self.name}: argument {i} {list(arg.shape)} is on {arg.device}, but the graphs run on "
                    f"{self.device}; move it there first"
                )
            key.append((tuple(arg.shape), arg.dtype))
        return tuple(key)

    def _count_eager(self, reason: str) -> None:
        with self._lock:
            self._tally.eager_reasons[reason] = self._tally.eager_reasons.get(reason, 0) + 1

    def _capture_key(self, key: GraphKey, args: tuple[torch.Tensor, ...], *, explicit: bool) -> tuple[_Entry, T] | None:
        """Capture `key` once (other callers of it wait), or None when this call must run eagerly (counted)."""
        with self._lock:
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                entry = self._entries.get(key)
                failed = key in self._failed
                stopped = self._capture_stopped is not None
            if entry is not None:  # a concurrent first caller captured it while we waited
                return entry, self._replay(entry, args)
            if failed or stopped:
                if not explicit:
                    self._count_eager("capture_failed" if failed else "capture_stopped")
                return None
            if not (self.lazy or explicit):
                self._count_eager("not_captured")
                return None
            if not explicit and self._below_capture_after(key):
                self._count_eager("below_capture_after")
                return None
            try:
                entry, first = self._capture(key, args)
            except _CaptureError as exc:
                self._record_failure(key, str(exc))
                if not explicit:
                    self._count_eager("capture_failed")
                return None
            finally:
                with self._lock:
                    self._key_locks.pop(key, None)
            self._publish(entry)
            return entry, first

    def _below_capture_after(self, key: GraphKey) -> bool:
        """Count this call of an uncaptured key; True while it has been called fewer than `capture_after` times."""
        if self.capture_after <= 1:
            return False
        with self._lock:
            calls = self._seen.pop(key, 0) + 1
            if calls < self.capture_after:
                self._seen[key] = calls  # most recent last; bounded like the failed keys
                while len(self._seen) > _FAILED_KEYS_FACTOR * self.max_graphs:
                    self._seen.popitem(last=False)
                return True
        return False

    def _capture(self, key: GraphKey, args: tuple[torch.Tensor, ...]) -> tuple[_Entry, T]:
        api = self._api
        assert api is not None
        start = time.perf_counter()
        with _CAPTURE_LOCK:
            if self._pool is None:
                self._pool = api.new_pool()
                self._side_stream = api.new_stream(self.device)
            side = self._side_stream
            caller = api.current_stream(self.device)
            with _capture_modes():
                inputs = tuple(torch.empty_like(arg) for arg in args)
                for buffer, arg in zip(inputs, args, strict=True):
                    buffer.copy_(arg)
                side.wait_stream(caller)
                with api.use_stream(side):
                    reference: Any = None
                    for _ in range(self.warmup_iters):  # fn's own errors propagate from here
                        reference = self.fn(*inputs)
                    graph = api.new_graph()
                    try:
                        with api.capture(graph, pool=self._pool, stream=side):
                            outputs = self.fn(*inputs)
                    except Exception as exc:  # any runtime error of the capture itself
                        raise _CaptureError(f"capture raised {type(exc).__name__}: {exc}") from exc
                caller.wait_stream(side)
        entry = _Entry(key, graph, inputs, outputs)
        try:
            first = self._replay(entry, None)
        except Exception as exc:
            raise _CaptureError(f"first replay raised {type(exc).__name__}: {exc}") from exc
        if self.verify:
            problem = _mismatch(first, reference)
            if problem is not None:
                raise _CaptureError(f"verification failed: {problem}")
        with self._lock:
            self._tally.capture_ms += (time.perf_counter() - start) * 1e3
        return entry, first

    def _replay(self, entry: _Entry, args: tuple[torch.Tensor, ...] | None) -> Any:
        api = self._api
        assert api is not None
        with self._replay_lock:
            stream = api.current_stream(self.device)
            if self._done_event is not None:
                stream.wait_event(self._done_event)  # the previous replay of this runner, on any stream
            if args is not None:
                with torch.no_grad():
                    for buffer, arg in zip(entry.inputs, args, strict=True):
                        buffer.copy_(arg)
            entry.graph.replay()
            out = _map_tensors(torch.clone, entry.outputs) if self.clone_outputs else entry.outputs
            if self._done_event is None:
                self._done_event = api.new_event()
            self._done_event.record(stream)
        with self._lock:
            self._tally.replays += 1
        return out

    def _publish(self, entry: _Entry) -> None:
        evicted = []
        with self._lock:
            self._entries[entry.key] = entry
            self._entries.move_to_end(entry.key)
            self._tally.captures += 1
            while len(self._entries) > self.max_graphs:
                old_key, _ = self._entries.popitem(last=False)
                self._tally.evictions += 1
                evicted.append(old_key)
            live = len(self._entries)
        logger.info(
            "%s: captured %s graph for %s (%d/%d graphs)",
            self.name,
            self.backend,
            describe_key(entry.key),
            live,
            self.max_graphs,
        )
        for key in evicted:
            # Dropping the entry is enough: a replay still in flight holds its own reference, and the
            # runtime frees an executable graph only after its queued launches finish.
            logger.info("%s: evicted the least recently used graph %s", self.name, describe_key(key))

    def _record_failure(self, key: GraphKey, reason: str) -> None:
        with self._lock:
            self._tally.failures += 1
            self._tally.last_failure = f"{describe_key(key)}: {reason}"
            failures = self._tally.failures
            self._failed[key] = reason
            while len(self._failed) > _FAILED_KEYS_FACTOR * self.max_graphs:
                self._failed.popitem(last=False)
            if failures >= MAX_FAILURES and self._capture_stopped is None:
                self._capture_stopped = f"{failures} failed captures"
                stop = True
            else:
                stop = False
        if failures == 1:
            logger.warning(
                "%s: capturing a %s graph for %s failed (%s); that shape runs eagerly from now on",
                self.name,
                self.backend,
                describe_key(key),
                reason,
            )
        else:
            logger.debug("%s: capture for %s failed (%s)", self.name, describe_key(key), reason)
        if stop:
            logger.warning(
                "%s: %d captures failed; no new shapes are captured (new shapes run eagerly)", self.name, failures
            )

    # -- bookkeeping -------------------------------------------------------------------------------

    def counters(self) -> GraphCounters:
        with self._lock:
            tally = self._tally
            reasons = dict(tally.eager_reasons)
            return GraphCounters(
                name=self.name,
                backend=self.backend,
                disabled_reason=self._disabled_reason,
                capture_stopped=self._capture_stopped,
                graphs=len(self._entries),
                max_graphs=self.max_graphs,
                captures=tally.captures,
                replays=tally.replays,
                eager_fallbacks=sum(reasons.values()),
                disabled_calls=tally.disabled_calls,
                evictions=tally.evictions,
                failures=tally.failures,
                capture_ms=tally.capture_ms,
                eager_reasons=reasons,
                last_failure=tally.last_failure,
            )

    def captured_keys(self) -> list[GraphKey]:
        """Keys with a graph, least recently used first."""
        with self._lock:
            return list(self._entries)

    def log_counters(self) -> None:
        logger.info("%s", self.counters().summary())

    def clear(self) -> None:
        """Drop every graph and failed-key record, so shapes are captured again (e.g. new weights); counters stay."""
        with self._lock:
            self._entries.clear()
            self._failed.clear()
            self._seen.clear()
            self._capture_stopped = None

    def __repr__(self) -> str:
        return f"DeviceGraphRunner({self.name!r}, device={self.device}, backend={self.backend!r})"


def all_graph_counters() -> list[GraphCounters]:
    """Counters of every live runner of this process (benchmarks, operator dumps), by name."""
    with _registry_lock:
        runners = list(_registry)
    return sorted((r.counters() for r in runners), key=lambda c: c.name)


__all__ = [
    "FROM_PLATFORM",
    "MAX_FAILURES",
    "VERIFY_ATOL",
    "VERIFY_RTOL",
    "DeviceGraphRunner",
    "GraphCounters",
    "GraphKey",
    "all_graph_counters",
    "describe_key",
]
