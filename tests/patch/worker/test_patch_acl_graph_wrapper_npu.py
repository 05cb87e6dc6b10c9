# SPDX-License-Identifier: Apache-2.0
"""The ACL capture guard on the real vllm-ascend `ACLGraphWrapper`, capturing real NPU graphs (Ascend only).

The CPU twins are the fake-based tests (`test_graph_wrapper_guards.py`, same rule, fakes that mirror
the stock control flow) and the real-vLLM CUDA-wrapper tests (`test_patch_cuda_graph_wrapper_real_vllm.py`). Here the
stock wrapper captures an `NPUGraph` in the capture window and the guard must leave that alone:
a captured descriptor replays (the runnable is not called again) and an uncaptured one runs eager
and is counted, where the unguarded wrapper raises "CUDA graph capturing detected at an
inappropriate time".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.mark import hardware_test

pytestmark = [pytest.mark.full_model]


def _forward_context(fc: Any, mode: Any, descriptor: Any) -> Any:
    """A ForwardContext of this vLLM version: required fields empty, the mode and descriptor set."""
    required = {
        f.name: {}
        for f in dataclasses.fields(fc.ForwardContext)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.init
    }
    required.update(cudagraph_runtime_mode=mode, batch_descriptor=descriptor)
    return fc.ForwardContext(**required)


@pytest.fixture
def ascend() -> Iterator[dict[str, Any]]:
    acl_graph = pytest.importorskip(
        "vllm_ascend.compilation.acl_graph", reason="vllm-ascend is not installed on this NPU host"
    )
    import torch
    import vllm.compilation.monitor as monitor
    from vllm import forward_context
    from vllm.config import CUDAGraphMode, VllmConfig
    from vllm.forward_context import BatchDescriptor

    from vllm_omni_token2wav.patch.worker import patch_acl_graph_wrapper as acl_guard

    before = monitor.cudagraph_capturing_enabled
    acl_guard.reset_stats()
    yield {
        "acl_graph": acl_graph,
        "torch": torch,
        "monitor": monitor,
        "fc": forward_context,
        "mode": CUDAGraphMode,
        "config": VllmConfig(),
        "descriptor": BatchDescriptor,
        "guard": acl_guard,
    }
    acl_guard.uninstall()
    acl_guard.reset_stats()
    monitor.set_cudagraph_capturing_enabled(before)


@hardware_test(res={"npu": "A2"})
def test_guard_on_the_real_aclgraph_wrapper_keeps_capture_and_replay_and_runs_misses_eager(
    ascend: dict[str, Any],
) -> None:
    torch, monitor, fc, mode = ascend["torch"], ascend["monitor"], ascend["fc"], ascend["mode"]
    calls: list[int] = []

    def runnable(x: Any) -> Any:
        calls.append(1)
        return x * 2 + 1

    wrapper = ascend["acl_graph"].ACLGraphWrapper(runnable, ascend["config"], mode.PIECEWISE)
    captured, missed = ascend["descriptor"](num_tokens=8), ascend["descriptor"](num_tokens=16)
    x8 = torch.arange(8, dtype=torch.float32, device="npu")
    x16 = torch.arange(16, dtype=torch.float32, device="npu")

    def step(x: Any, descriptor: Any) -> Any:
        with fc.override_forward_context(_forward_context(fc, mode.PIECEWISE, descriptor)):
            return wrapper(x)

    # Unguarded: the stock call refuses to capture after the capture window.
    monitor.set_cudagraph_capturing_enabled(False)
    with pytest.raises(RuntimeError, match="inappropriate time"):
        step(x16, missed)

    ascend["guard"].install()
    # Capture window: the stock call captures through the guard.
    monitor.set_cudagraph_capturing_enabled(True)
    out = step(x8, captured)
    torch.npu.synchronize()
    assert wrapper.concrete_aclgraph_entries[captured].aclgraph is not None
    assert torch.equal(out.cpu(), (x8 * 2 + 1).cpu())
    calls_after_capture = len(calls)

    # After the window: the captured descriptor replays, the missed one runs eager and is counted.
    monitor.set_cudagraph_capturing_enabled(False)
    replayed = step(x8, captured)
    torch.npu.synchronize()
    assert len(calls) == calls_after_capture  # replay, the runnable was not called
    assert torch.equal(replayed.cpu(), (x8 * 2 + 1).cpu())
    eager = step(x16, missed)
    assert len(calls) == calls_after_capture + 1
    assert torch.equal(eager.cpu(), (x16 * 2 + 1).cpu())
    assert ascend["guard"].stats()["eager_steps"] == 1
