# SPDX-License-Identifier: Apache-2.0
"""The device-graph capture helper's bookkeeping, against a fake graph runtime that replays recorded ops.

The fake (`tests/helpers/fake_device_graphs.py`) behaves like a real graph where it matters here: a
replay re-runs the captured kernels on the captured memory (Python does not run again), outputs hold
garbage until the first replay, a host sync inside a capture fails it, and two captures at once fail.
References are computed in float64 numpy inside each test.
"""

from __future__ import annotations

import itertools
import logging
import threading
import types

import numpy as np
import pytest
import torch

from tests.helpers.fake_device_graphs import FakeGraphModule, fake_graph_api, install_fake_npu_with_graphs
from tests.helpers.fake_npu import install_fake_torch_npu
from tests.helpers.mark import hardware_test
from vllm_omni_token2wav import envs, platforms
from vllm_omni_token2wav.platforms.cpu.platform import CpuDevicePlatform
from vllm_omni_token2wav.platforms.cuda.platform import CudaDevicePlatform
from vllm_omni_token2wav.platforms.device_graphs import MAX_FAILURES, DeviceGraphRunner, all_graph_counters
from vllm_omni_token2wav.platforms.graph_api import TorchGraphApi
from vllm_omni_token2wav.platforms.npu.platform import NpuDevicePlatform

pytestmark = [pytest.mark.core_model]
cpu = pytest.mark.cpu

GEN = torch.Generator().manual_seed(0)
W = torch.randn(8, 6, generator=GEN)
B = torch.randn(6, generator=GEN)


def _net(x: torch.Tensor) -> torch.Tensor:
    """The device work under test: relu(x W + b) * 2, several aten ops incl. in-place ones."""
    y = torch.relu_(x @ W + B)
    y.mul_(2.0)
    return y


def _ref(x: torch.Tensor) -> np.ndarray:
    return np.maximum(x.double().numpy() @ W.double().numpy() + B.double().numpy(), 0.0) * 2.0


def _close(got: torch.Tensor, x: torch.Tensor) -> bool:
    return bool(np.allclose(got.double().numpy(), _ref(x), rtol=1e-5, atol=1e-5))


def _x(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, 8, generator=torch.Generator().manual_seed(seed))


class _Counted:
    """Wraps `_net`, counting how often Python actually runs it."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return _net(x)


def _runner(fn=_net, module: FakeGraphModule | None = None, **kwargs) -> tuple[DeviceGraphRunner, FakeGraphModule]:
    api, module = fake_graph_api(module)
    return DeviceGraphRunner(fn, name=kwargs.pop("name", "test-net"), device="cpu", graph_api=api, **kwargs), module


@cpu
def test_first_call_captures_once_and_later_calls_replay_on_new_inputs() -> None:
    fn = _Counted()
    runner, module = _runner(fn, warmup_iters=2)
    inputs = [_x(4, seed) for seed in range(5)]
    for x in inputs:
        assert _close(runner(x), x)
    counters = runner.counters()
    assert (counters.captures, counters.graphs, counters.replays) == (1, 1, 5)
    assert counters.eager_fallbacks == counters.failures == 0
    # Python ran only for the two warm-ups and the capture: every result came from a replay.
    assert fn.calls == 3
    assert module.replays == 5 and len(module.captures) == 1


@cpu
def test_each_shape_and_dtype_gets_its_own_graph() -> None:
    runner, _ = _runner()
    for x in (_x(4, 1), _x(5, 2), _x(4, 3), _x(5, 4)):
        assert _close(runner(x), x)
    x64 = _x(4, 5).double()
    with pytest.raises(RuntimeError):  # W is float32: the dtype is part of the key, so this one is captured...
        runner(x64)  # ...and fails in fn's own eager warm-up, which propagates (not a capture failure)
    counters = runner.counters()
    assert counters.captures == 2 and counters.failures == 0
    assert sorted(k[0][0] for k in runner.captured_keys()) == [(4, 8), (5, 8)]


@cpu
def test_lru_cap_evicts_the_least_recently_used_graph() -> None:
    runner, _ = _runner(max_graphs=2)
    a, b, c = _x(1, 1), _x(2, 2), _x(3, 3)
    for x in (a, b, a, c):  # a was used after b, so b is the least recently used when c arrives
        assert _close(runner(x), x)
    assert [k[0][0][0] for k in runner.captured_keys()] == [1, 3]
    counters = runner.counters()
    assert (counters.captures, counters.evictions, counters.graphs) == (3, 1, 2)
    assert _close(runner(b), b)  # b is captured again and evicts a
    assert runner.counters().captures == 4
    assert [k[0][0][0] for k in runner.captured_keys()] == [3, 2]


@cpu
def test_capture_after_keeps_one_off_shapes_eager_and_captures_recurring_ones() -> None:
    fn = _Counted()
    runner, module = _runner(fn, capture_after=2, warmup_iters=1)
    once, recurring = _x(3, 1), [_x(4, seed) for seed in range(4)]
    assert _close(runner(once), once)  # seen once: eager, no capture
    for x in recurring:  # 1st call eager, 2nd captures (warm-up + capture) and replays, then replays
        assert _close(runner(x), x)
    counters = runner.counters()
    assert (counters.captures, counters.replays, counters.graphs) == (1, 3, 1)
    assert counters.eager_reasons == {"below_capture_after": 2} and counters.failures == 0
    assert [k[0][0] for k in runner.captured_keys()] == [(4, 8)]
    assert fn.calls == 2 + 2 and len(module.captures) == 1  # 2 eager calls, 1 warm-up + 1 capture
    assert runner.warmup(_x(5, 9)) and runner.counters().captures == 2  # explicit warm-up captures at once
    with pytest.raises(ValueError, match="capture_after"):
        _runner(capture_after=0)


@cpu
def test_max_graphs_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(envs.DEVICE_GRAPHS_MAX_ENV, "3")
    assert _runner()[0].max_graphs == 3
    monkeypatch.setenv(envs.DEVICE_GRAPHS_MAX_ENV, "0")
    with pytest.raises(ValueError, match=envs.DEVICE_GRAPHS_MAX_ENV):
        _runner()
    with pytest.raises(ValueError, match="max_graphs"):
        _runner(max_graphs=0)


@cpu
@pytest.mark.parametrize("how", ["flag", "env"])
@cpu
def test_switch_off_runs_fn_unchanged_and_counts(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    fn = _Counted()
    if how == "env":
        monkeypatch.setenv(envs.DEVICE_GRAPHS_ENV, "off")
        runner, module = _runner(fn)
    else:
        runner, module = _runner(fn, enabled=False)
    for seed in range(3):
        x = _x(4, seed)
        assert _close(runner(x), x)
    counters = runner.counters()
    assert not runner.graphs_active and counters.backend == "eager"
    assert (counters.captures, counters.replays, counters.disabled_calls) == (0, 0, 3)
    assert fn.calls == 3 and not module.captures
    assert counters.disabled_reason is not None and (how == "flag") == ("enabled=False" in counters.disabled_reason)


@cpu
def test_switch_rejects_unknown_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(envs.DEVICE_GRAPHS_ENV, "maybe")
    with pytest.raises(ValueError, match=envs.DEVICE_GRAPHS_ENV):
        _runner()


@cpu
def test_enabled_true_overrides_the_environment_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(envs.DEVICE_GRAPHS_ENV, "0")
    runner, _ = _runner(enabled=True)
    x = _x(2, 0)
    assert _close(runner(x), x) and runner.counters().captures == 1


@cpu
def test_failed_capture_falls_back_to_eager_once_per_key_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    runner, module = _runner()
    module.fail_captures = 2
    caplog.set_level(logging.DEBUG, logger="vllm_omni_token2wav")
    a1, a2, b1 = _x(4, 1), _x(4, 2), _x(5, 3)
    assert _close(runner(a1), a1)  # capture fails: this call runs eagerly
    assert _close(runner(a2), a2)  # the key is known to fail: eager, no second attempt
    assert _close(runner(b1), b1)  # another key fails too
    counters = runner.counters()
    assert (counters.failures, counters.captures, counters.graphs) == (2, 0, 0)
    assert counters.eager_fallbacks == 3 and counters.eager_reasons == {"capture_failed": 3}
    assert len(module.captures) == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "test-net" in r.getMessage()]
    assert len(warnings) == 1 and "injected capture failure" in warnings[0].getMessage()
    assert counters.last_failure is not None and counters.last_failure.startswith("[5, 8] float32: capture raised")


@cpu
def test_host_sync_inside_fn_fails_the_capture_and_results_stay_correct() -> None:
    def branchy(x: torch.Tensor) -> torch.Tensor:
        return x * 2 if bool(x.sum() > 0) else x * -3  # reads a device value on the host

    runner, _ = _runner(branchy)
    pos, neg = torch.ones(3), -torch.ones(3)
    assert torch.equal(runner(pos), pos * 2)  # warm-up fine, capture raises, eager result
    assert torch.equal(runner(neg), neg * -3)  # a frozen branch would have returned neg * 2
    counters = runner.counters()
    assert counters.failures == 1 and counters.captures == 0 and counters.eager_fallbacks == 2


@cpu
def test_after_max_failures_no_new_shape_is_captured_but_graphs_keep_replaying() -> None:
    runner, module = _runner()
    good = _x(1, 0)
    runner(good)
    module.fail_captures = MAX_FAILURES
    for rows in range(2, 2 + MAX_FAILURES):
        x = _x(rows, rows)
        assert _close(runner(x), x)
    attempts = len(module.captures)
    late = _x(9, 9)
    assert _close(runner(late), late)
    assert len(module.captures) == attempts  # not attempted
    assert _close(runner(good), good)
    counters = runner.counters()
    assert counters.capture_stopped is not None and counters.disabled_reason is None
    assert counters.eager_reasons == {"capture_failed": MAX_FAILURES, "capture_stopped": 1}
    assert counters.replays == 2  # the good shape: its first call and the last one
    runner.clear()
    assert runner.counters().capture_stopped is None and runner.captured_keys() == []


@cpu
def test_verification_rejects_a_graph_that_froze_a_changing_python_value() -> None:
    step = itertools.count(1)

    def drifting(x: torch.Tensor) -> torch.Tensor:
        return x * next(step)  # a Python value: the graph keeps the one it saw while capturing

    runner, _ = _runner(drifting, warmup_iters=1)
    x = torch.ones(2)
    runner(x)
    counters = runner.counters()
    assert counters.failures == 1 and counters.captures == 0

    unchecked, _ = _runner(drifting, warmup_iters=1, verify=False, name="unchecked")
    unchecked(x)
    assert unchecked.counters().captures == 1 and unchecked.counters().failures == 0


@cpu
def test_an_error_of_fn_itself_propagates_and_is_not_a_capture_failure() -> None:
    def picky(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 3:
            raise ValueError("3 rows are not supported")
        return _net(x)

    runner, module = _runner(picky)
    with pytest.raises(ValueError, match="3 rows"):
        runner(_x(3, 0))
    with pytest.raises(ValueError, match="3 rows"):  # no failed-key record: the next call raises the same way
        runner(_x(3, 1))
    counters = runner.counters()
    assert counters.failures == 0 and counters.captures == 0 and not module.captures


@cpu
def test_lazy_off_captures_only_at_explicit_warmup() -> None:
    fn = _Counted()
    runner, _ = _runner(fn, lazy=False)
    x = _x(4, 0)
    assert _close(runner(x), x)
    assert runner.counters().eager_reasons == {"not_captured": 1}
    assert runner.warmup(_x(4, 1)) is True
    assert runner.warmup(_x(4, 2)) is True  # already there: no second capture
    calls = fn.calls
    for seed in range(3, 6):
        x = _x(4, seed)
        assert _close(runner(x), x)
    counters = runner.counters()
    assert counters.captures == 1 and fn.calls == calls
    assert _runner(enabled=False)[0].warmup(x) is False


@cpu
def test_outputs_are_clones_by_default_and_static_buffers_when_asked() -> None:
    owned, _ = _runner()
    a, b = _x(2, 1), _x(2, 2)
    out_a = owned(a)
    owned(b)
    assert _close(out_a, a)  # not overwritten by the later call

    static, _ = _runner(clone_outputs=False, name="static")
    out_a = static(a)
    kept = out_a.clone()
    out_b = static(b)
    assert out_b is out_a and _close(out_b, b)  # the same tensor, overwritten by the next replay
    assert not torch.equal(out_a, kept)


@cpu
def test_structured_outputs_are_replayed_and_cloned() -> None:
    def pair(x: torch.Tensor) -> dict[str, object]:
        return {"y": _net(x), "parts": (x.sum(dim=1), x.max(dim=1).values)}

    runner, _ = _runner(pair)
    for seed in range(3):
        x = _x(3, seed)
        out = runner(x)
        assert _close(out["y"], x)
        np.testing.assert_allclose(out["parts"][0].numpy(), x.double().numpy().sum(axis=1), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out["parts"][1].numpy(), x.numpy().max(axis=1))


@cpu
@pytest.mark.parametrize("first_in_inference_mode", [True, False])
@cpu
def test_capture_and_replay_work_inside_and_outside_inference_mode(first_in_inference_mode: bool) -> None:
    runner, _ = _runner()
    x1, x2, x3 = _x(4, 1), _x(4, 2), _x(4, 3)
    if first_in_inference_mode:
        with torch.inference_mode():
            x1 = x1.clone()  # an inference tensor as the argument too
            assert _close(runner(x1), x1)
        out = runner(x2)  # static buffers created in inference mode would reject this copy
    else:
        assert _close(runner(x1), x1)
        with torch.inference_mode():
            out = runner(x2)
    assert _close(out, x2)
    out_outside = runner(x3)
    out_outside.add_(1.0)  # a normal tensor: in-place use outside inference mode is allowed
    assert not out_outside.is_inference()
    assert runner.counters().captures == 1


@cpu
def test_many_threads_capture_each_key_once_and_get_their_own_results() -> None:
    fn = _Counted()
    runner, module = _runner(fn, warmup_iters=1)
    errors: list[str] = []
    start = threading.Barrier(8)

    def worker(index: int) -> None:
        start.wait()
        for call in range(12):
            x = _x(1 + (index + call) % 3, 100 * index + call)
            out = runner(x)
            if not _close(out, x):
                errors.append(f"thread {index} call {call}: wrong result")

    threads = [threading.Thread(target=worker, args=(i,), name=f"worker-{i}") for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    counters = runner.counters()
    assert counters.captures == 3 and len(module.captures) == 3
    assert counters.replays == 8 * 12 and counters.eager_fallbacks == 0
    assert module.max_concurrent_captures == 1
    assert fn.calls == 3 * 2  # one warm-up and one capture per key, never a replay


@cpu
def test_captures_use_one_side_stream_one_pool_and_the_thread_local_mode() -> None:
    runner, module = _runner()
    for rows in (1, 2, 3):
        runner(_x(rows, rows))
    pools = {id(c.pool) for c in module.captures}
    streams = {id(c.stream) for c in module.captures}
    assert len(pools) == 1 and len(streams) == 1
    side = module.captures[0].stream
    assert side is not module.default_stream
    assert module.default_stream in side.waited_streams  # inputs written on the caller's stream first
    assert {c.capture_error_mode for c in module.captures} == {"thread_local"}
    assert module.default_stream.waited_events  # replays chained by the runner's event


@cpu
def test_arguments_must_be_tensors_on_the_runner_device() -> None:
    runner, _ = _runner()
    with pytest.raises(TypeError, match="functools.partial"):
        runner(_x(2, 0), 3)
    with pytest.raises(ValueError, match="meta"):
        runner(torch.empty(2, 8, device="meta"))


@cpu
def test_counters_are_listed_for_every_live_runner_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    runner, _ = _runner(name="listed-net")
    runner(_x(2, 0))
    listed = [c for c in all_graph_counters() if c.name == "listed-net"]
    assert len(listed) == 1 and listed[0].captures == 1 and listed[0].as_dict()["replays"] == 1
    caplog.set_level(logging.INFO, logger="vllm_omni_token2wav")
    runner.log_counters()
    assert "listed-net: fake-graph, 1/64 graphs, 1 captures" in caplog.text


@cpu
def test_cpu_device_and_cpu_platform_run_eagerly() -> None:
    platforms.reset_current_platform(CpuDevicePlatform())
    try:
        runner = DeviceGraphRunner(_net, name="cpu-net", device="cpu")
        x = _x(2, 0)
        assert _close(runner(x), x)
        assert runner.counters().disabled_reason == "CPU runs eagerly"
    finally:
        platforms.reset_current_platform(None)
    assert CpuDevicePlatform().device_graph_api() is None
    assert CpuDevicePlatform().memory_stats() is None


@cpu
def test_npu_platform_builds_the_graph_api_from_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    module = install_fake_npu_with_graphs(monkeypatch)
    api = NpuDevicePlatform().device_graph_api()
    assert isinstance(api, TorchGraphApi) and api.name == "npu-graph"
    assert api.capture_error_mode == "thread_local"
    runner = DeviceGraphRunner(_net, name="npu-net", device="cpu", graph_api=api)
    for seed in range(2):
        x = _x(3, seed)
        assert _close(runner(x), x)
    assert len(module.captures) == 1 and module.replays == 2


@cpu
def test_npu_platform_without_a_graph_api_runs_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_torch_npu(monkeypatch)  # a torch_npu without NPUGraph
    assert NpuDevicePlatform().device_graph_api() is None


@cpu
def test_cuda_platform_adapts_torch_cuda() -> None:
    api = CudaDevicePlatform().device_graph_api()
    assert isinstance(api, TorchGraphApi) and api.name == "cuda-graph"
    assert api.capture_error_mode == "thread_local"


@cpu
def test_adapter_names_what_a_device_module_lacks() -> None:
    partial = types.SimpleNamespace(graph=None, Stream=None, stream=None, current_stream=None, Event=None)
    with pytest.raises(RuntimeError, match="has no NPUGraph, graph_pool_handle;"):
        TorchGraphApi(partial, "NPUGraph", "partial")


@hardware_test(res={"npu": "A2", "cuda": "H100"}, num_cards=1)
def test_real_graph_runtime_captures_once_and_replays_new_inputs() -> None:
    """Hardware twin of the fake-runtime tests: the platform's own graph API on its device."""
    device = platforms.current_omni_platform.torch_device()
    w, b = W.to(device), B.to(device)
    calls = []

    def net(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return torch.relu_(x @ w + b).mul_(2.0)

    runner = DeviceGraphRunner(net, name="device-net", device=device, enabled=True)
    assert runner.graphs_active, runner.counters().disabled_reason
    for seed in range(4):
        x = _x(4, seed)
        assert _close(runner(x.to(device)).cpu(), x)
    counters = runner.counters()
    assert (counters.captures, counters.replays, counters.failures) == (1, 4, 0), counters.summary()
    assert len(calls) == 3  # two warm-ups and the capture: every result came from a replay
