#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Per-call overhead of the guarded graph-wrapper `__call__` vs the stock one on the replay path.

The guard sits on the replay hot path (once per piecewise segment per step), so its cost must stay
at a dict lookup and a few attribute reads. Runs on CPU against the fake wrapper of the tests
(stock control flow, fake graph). Interleaves stock and guarded blocks so drift cancels.

    .venv/bin/python benchmarks/graph_guard_overhead.py [--calls 20000] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest  # noqa: E402

from tests.helpers.fake_vllm import (  # noqa: E402
    BatchDescriptor,
    CUDAGraphMode,
    Entry,
    FakeGraph,
    ForwardContext,
    install_fake_vllm,  # noqa: E402
)


def _per_call_ns(wrapper: object, calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        wrapper(1)  # type: ignore[operator]
    return (time.perf_counter_ns() - start) / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/graph_guard_overhead.json"))
    args = parser.parse_args()

    monkeypatch = pytest.MonkeyPatch()
    fake = install_fake_vllm(monkeypatch)
    from vllm_omni.platforms.npu.attention import static_shape_decode

    desc = BatchDescriptor(num_tokens=8)
    fake.set_context(ForwardContext(cudagraph_runtime_mode=CUDAGraphMode.PIECEWISE, batch_descriptor=desc))
    fake.monitor.set_cudagraph_capturing_enabled(False)
    stock_call = fake.acl_wrapper.__call__
    wrapper = fake.acl_wrapper(lambda x: x, object(), CUDAGraphMode.PIECEWISE)
    wrapper.concrete_aclgraph_entries[desc] = Entry(desc, graph=FakeGraph(), output=1)

    static_shape_decode.install_into_ascend_aclgraph()
    guarded_call = fake.acl_wrapper.__call__
    stock, guarded = [], []
    for _ in range(args.blocks):
        fake.acl_wrapper.__call__ = stock_call
        stock.append(_per_call_ns(wrapper, args.calls))
        fake.acl_wrapper.__call__ = guarded_call
        guarded.append(_per_call_ns(wrapper, args.calls))
    static_shape_decode.uninstall_from_ascend_aclgraph()
    monkeypatch.undo()

    result = {
        "calls_per_block": args.calls,
        "blocks": args.blocks,
        "stock_ns_median": statistics.median(stock),
        "guarded_ns_median": statistics.median(guarded),
        "overhead_ns_median": statistics.median(g - s for g, s in zip(guarded, stock, strict=True)),
        "loadavg": os.getloadavg(),
        "python": sys.version.split()[0],
    }
    print(f"{'path':<10}{'ns/call (median)':>18}")
    print(f"{'stock':<10}{result['stock_ns_median']:>18.0f}")
    print(f"{'guarded':<10}{result['guarded_ns_median']:>18.0f}")
    print(f"{'overhead':<10}{result['overhead_ns_median']:>18.0f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=args.json.parent, delete=False, suffix=".tmp") as handle:
        json.dump(result, handle, indent=2)
    os.replace(handle.name, args.json)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
