#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""Where a CPU CAM++ call spends its time: per-section latency, FLOP rate against the floor, top ops.

Why: `vllm-omni-token2wav bench spk-embedding` says whether torch beats onnxruntime; when it does not, this
script shows why. For each T and thread count it times the folded form's sections separately
(head convs + TDNN, the three dense blocks, the transits, statistics + dense), interleaved with the
whole call and with onnxruntime's session, 100 ms apart (idle thread pools asleep, as in serving),
and divides each section's FLOPs (counted from the network's shapes) by its median time. It also
lists the top aten ops of one call (torch profiler, self CPU time) and how long each runtime's idle
workers keep a core busy after a call (per-thread schedstat, Linux).

    .venv/bin/python benchmarks/campplus_cpu_profile.py                       # T 97,200,501,1000; 1 and 2 threads
    .venv/bin/python benchmarks/campplus_cpu_profile.py --lengths 97 --repeats 10 --output out/p.json

Stand-in weights (full size); writes benchmarks/results/campplus_cpu_profile.json atomically.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
GAP_S = 0.1


def section_flops(net: Any, frames: int) -> dict[str, float]:
    """Multiply-adds x 2 of each section of the folded CAM++ at `frames` input frames (batch 1)."""
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.inference import _Block

    flops = {"head": 0.0}
    feat = net.feat_dim
    convs = (
        [net.head_conv1] + [c for b in net.head_blocks for c in (b.conv1, b.conv2, b.shortcut) if c] + [net.head_conv2]
    )
    fin = {id(net.head_conv1): feat}
    height = feat
    for block in net.head_blocks:
        out = (height + 2 * block.conv1.padding[0] - 3) // block.conv1.stride[0] + 1
        fin[id(block.conv1)], fin[id(block.conv2)] = height, out
        if block.shortcut is not None:
            fin[id(block.shortcut)] = height
        height = out
    fin[id(net.head_conv2)] = height
    for conv in convs:
        cout, cin, kh, kw = conv.weight.shape
        fout = (fin[id(conv)] + 2 * conv.padding[0] - kh) // conv.stride[0] + 1
        flops["head"] += 2.0 * cout * cin * kh * kw * fout * frames
    pooled = (frames + 1) // 2
    cout, cin, k = net.tdnn.weight.shape
    flops["tdnn"] = 2.0 * cout * cin * k * pooled
    blocks = [s for s in net.stages if isinstance(s, _Block)]
    for i, block in enumerate(blocks):
        total = 0.0
        for layer in block.layers:
            cin_l, bn = layer.w1.shape
            total += 2.0 * pooled * (cin_l * bn + bn * layer.w_taps.shape[1])
        flops[f"block{i + 1}"] = total
    flops["transits"] = sum(2.0 * pooled * s.weight.shape[0] * s.weight.shape[1] for s in net.stages if s not in blocks)
    flops["stats+dense"] = 2.0 * net.dense[0].shape[0] * net.dense[0].shape[1] + 6.0 * pooled * net.dense[0].shape[0]
    return flops


def sections(net: Any, feats: Any) -> dict[str, Callable[[], Any]]:
    """Callables that run one section each on inputs prepared by running the call once."""
    import torch

    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.inference import _Block
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.masking import FrameInfo
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.pooling import statistics as stats_pool

    batch, frames, _ = feats.shape
    info = FrameInfo.dense(batch, frames, net.seg_pool_mode, feats.device, feats.dtype, net.acc_dtype)
    rows = batch * info.segments
    ctx_rows = torch.zeros((rows + -rows % net.row_multiple, net.ctx_channels))
    head_out = net._head(feats, info)
    x = net.tdnn(head_out).relu_().transpose(1, 2)
    out: dict[str, Callable[[], Any]] = {
        "head": lambda: net._head(feats, info),
        "tdnn": lambda: net.tdnn(head_out).relu_(),
    }
    inputs = []
    for stage in net.stages:
        inputs.append(x)
        if isinstance(stage, _Block):
            x = net._run_block(x.reshape(batch, info.pooled, -1), stage, info, None, ctx_rows)
        else:
            x = net._transit(x, stage)
    blocks = [i for i, s in enumerate(net.stages) if isinstance(s, _Block)]
    for n, i in enumerate(blocks):
        stage, xin = net.stages[i], inputs[i]
        out[f"block{n + 1}"] = lambda s=stage, xi=xin: net._run_block(
            xi.reshape(batch, info.pooled, -1), s, info, None, ctx_rows
        )
    transits = [(net.stages[i], inputs[i]) for i in range(len(net.stages)) if i not in blocks]
    out["transits"] = lambda: [net._transit(xi, s) for s, xi in transits]
    final = x
    dense_w, dense_b = net.dense

    def stats_dense() -> Any:
        stats = stats_pool(final.view(batch, info.pooled, -1), info, None, 1, net.acc_dtype)
        return torch.addmm(dense_b, net._padded_rows(stats), dense_w)

    out["stats+dense"] = stats_dense
    return out


def spin_down_ms(call: Callable[[], Any], windows: int = 30, window_s: float = 0.005) -> list[float]:
    """CPU ms that the process's other threads use in consecutive windows after one `call` (Linux)."""
    import threading

    me = threading.get_native_id()

    def others() -> int:
        total = 0
        for tid in os.listdir("/proc/self/task"):
            if int(tid) != me:
                try:
                    total += int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
                except (OSError, ValueError, IndexError):
                    pass
        return total

    time.sleep(0.3)
    call()
    prev, rows = others(), []
    for _ in range(windows):
        time.sleep(window_s)
        cur = others()
        rows.append(round((cur - prev) / 1e6, 2))
        prev = cur
    return rows


def main() -> int:
    import numpy as np
    import onnxruntime as ort
    import torch
    from torch.profiler import ProfilerActivity, profile

    from vllm_omni_token2wav.atomic_io import write_json_atomic
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.inference import CampplusInference
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import load_campplus_from_onnx
    from vllm_omni_token2wav.platforms.cpu.threads import intra_op_threads

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="97,200,501,1000")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--output", type=Path, default=RESULTS / "campplus_cpu_profile.json")
    args = parser.parse_args()
    lengths = [int(t) for t in args.lengths.split(",")]
    thread_counts = [int(n) for n in args.threads.split(",")]

    path = ensure_standin_campplus_onnx(seed=0)
    net = CampplusInference(load_campplus_from_onnx(path, seg_pool_mode="auto").eval())
    sessions = {}
    for n in thread_counts:
        options = ort.SessionOptions()
        options.intra_op_num_threads = n
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sessions[n] = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    result: dict[str, Any] = {
        "torch": torch.__version__,
        "onnxruntime": ort.__version__,
        "load_average_start": os.getloadavg(),
        "repeats": args.repeats,
        "gap_ms": GAP_S * 1e3,
        "rows": [],
    }
    for frames in lengths:
        feats = torch.from_numpy(np.random.default_rng(frames).standard_normal((1, frames, 80)).astype(np.float32))
        feats -= feats.mean(dim=1, keepdim=True)
        flops = section_flops(net, frames)
        for n in thread_counts:
            with torch.inference_mode(), intra_op_threads(n):
                parts = sections(net, feats)
                calls = {
                    "torch call": lambda x=feats: net(x),
                    "onnxruntime call": lambda s=sessions[n], x=feats: s.run(None, {"input": x.numpy()}),
                    **parts,
                }
                samples: dict[str, list[float]] = {k: [] for k in calls}
                names = list(calls)
                for r in range(args.repeats + 2):
                    for name in names[r % len(names) :] + names[: r % len(names)]:
                        start = time.perf_counter()
                        calls[name]()
                        if r >= 2:
                            samples[name].append((time.perf_counter() - start) * 1e3)
                        time.sleep(GAP_S)
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    net(feats)
            med = {k: statistics.median(v) for k, v in samples.items()}
            top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]
            row = {
                "frames": frames,
                "threads": n,
                "median_ms": {k: round(v, 3) for k, v in med.items()},
                "gflops": {k: round(flops[k] / (med[k] * 1e6), 1) for k in parts},
                "total_gflop": round(sum(flops.values()) / 1e9, 3),
                "torch_gflops_whole_call": round(sum(flops.values()) / (med["torch call"] * 1e6), 1),
                "top_ops_self_ms": {e.key: [round(e.self_cpu_time_total / 1e3, 3), e.count] for e in top},
                "load_average": os.getloadavg(),
            }
            result["rows"].append(row)
            print(
                f"T={frames} {n}t: torch {med['torch call']:.2f} ms, onnxruntime {med['onnxruntime call']:.2f} ms; "
                + ", ".join(f"{k} {med[k]:.2f} ms ({row['gflops'][k]} GFLOP/s)" for k in parts),
                flush=True,
            )
    with torch.inference_mode(), intra_op_threads(max(thread_counts)):
        feats = torch.randn(1, 200, 80)
        result["spin_down_ms_per_5ms_after_a_call"] = {
            f"torch {max(thread_counts)}t": spin_down_ms(lambda: net(feats)),
            f"onnxruntime {max(thread_counts)}t": spin_down_ms(
                lambda: sessions[max(thread_counts)].run(None, {"input": feats.numpy()})
            ),
        }
    result["load_average_end"] = os.getloadavg()
    for name, rows in result["spin_down_ms_per_5ms_after_a_call"].items():
        print(f"{name}: other threads' CPU ms per 5 ms window after a call: {rows}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.output, result)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
