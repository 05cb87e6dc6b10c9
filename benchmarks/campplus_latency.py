#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""CAM++ per-call latency: onnxruntime CPU (1 and N threads) vs the torch path on the platform device.

Interleaves the backends per repeat (noisy shared hosts), reports medians and the torch/ORT ratio,
plus cold build (onnx -> torch) and cache-hit time. Writes benchmarks/results/campplus_latency.json.
On a CPU platform torch runs at 1 and at N intra-op threads, like onnxruntime: torch's OpenMP pool
spins at every barrier (about a thousand parallel regions per call), which collapses when other
processes hold the cores; `OMP_WAIT_POLICY=PASSIVE` (read when torch loads) avoids that, so the
environment's value is recorded with the results.

    .venv/bin/python benchmarks/campplus_latency.py --repeats 20
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/campplus_latency.py --repeats 20 \
        --output benchmarks/results/campplus_latency_omp_passive.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def main() -> int:
    import numpy as np
    import onnxruntime as ort
    import torch

    from vllm_omni_token2wav import platforms
    from vllm_omni_token2wav.model_executor.models.speaker_embedding import torch_backend as set_
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnx", type=Path, default=None, help="campplus.onnx (default: full-size stand-in)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--frames", type=int, nargs="+", default=[97, 200, 501, 1000])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "campplus_latency.json")
    args = parser.parse_args()
    path = args.onnx or ensure_standin_campplus_onnx()
    device = platforms.current_omni_platform.torch_device()
    # torch thread counts to time: on CPU the same 1 / N split as onnxruntime; elsewhere the device
    # does the work and the host threads only launch kernels.
    torch_threads = sorted({1, args.threads}) if device.type == "cpu" else [args.threads]
    torch.set_num_threads(args.threads)

    loadavg_start = os.getloadavg()
    set_.clear_campplus_cache()
    t0 = time.perf_counter()
    backend = set_.get_campplus_torch(path, device)
    cold_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    set_.get_campplus_torch(path, device)
    hit_ms = (time.perf_counter() - t0) * 1e3

    def session(threads: int) -> ort.InferenceSession:
        o = ort.SessionOptions()
        o.intra_op_num_threads = threads
        o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return ort.InferenceSession(str(path), o, providers=["CPUExecutionProvider"])

    sessions = {"ort_1t": session(1), f"ort_{args.threads}t": session(args.threads)}
    rows = []
    for frames in args.frames:
        x = np.random.default_rng(frames).standard_normal((frames, 80)).astype(np.float32)
        x -= x.mean(0)
        xt = torch.from_numpy(x).to(device)
        torch_names = {n: f"{backend.name}_{n}t" for n in torch_threads}
        times: dict[str, list[float]] = {k: [] for k in [*sessions, *torch_names.values()]}
        for rep in range(args.repeats + 3):
            for name, s in sessions.items():
                t = time.perf_counter()
                s.run(None, {"input": x[None]})
                if rep >= 3:
                    times[name].append((time.perf_counter() - t) * 1e3)
            for threads, name in torch_names.items():
                torch.set_num_threads(threads)
                t = time.perf_counter()
                backend(xt)
                platforms.current_omni_platform.synchronize()
                if rep >= 3:
                    times[name].append((time.perf_counter() - t) * 1e3)
        torch.set_num_threads(args.threads)
        med = {k: statistics.median(v) for k, v in times.items()}
        best_ort = min(med[k] for k in sessions)
        best_torch = min(med[k] for k in torch_names.values())
        rows.append(
            {
                "frames": frames,
                **{f"{k}_ms": round(v, 2) for k, v in med.items()},
                "torch_over_best_ort": round(best_torch / best_ort, 2),
            }
        )
    result = {
        "onnx": str(path),
        "device": str(device),
        "threads": args.threads,
        "repeats": args.repeats,
        "loadavg_start": loadavg_start,
        "loadavg_end": os.getloadavg(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "cold_build_ms": round(cold_ms, 1),
        "cache_hit_ms": round(hit_ms, 3),
        "torch": torch.__version__,
        "onnxruntime": ort.__version__,
        "rows": rows,
    }
    print(
        f"cold build {cold_ms:.0f} ms, cache hit {hit_ms:.3f} ms, loadavg {loadavg_start} -> {os.getloadavg()}, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}"
    )
    keys = list(rows[0])
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(str(r[k]) for k in keys))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
