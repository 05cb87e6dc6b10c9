#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Measure the CosyVoice3 flow's cross-request launch: B streams' chunks in one `stream_chunks` call vs B calls.

Why: the stage runs the chunks of every request of a step in one flow launch (per-frame ops ragged
across rows, attention per row, `flow/batched.py`). CI pins the result (each row equals the row run
alone); this prints what the launch saves and how far the rows move, for docs/design/cosyvoice3.md
("Cross-request batching"). Per chunk index the solo calls and the batched call alternate in order
(A/B interleaved), on streams with different prompts and noise seeds, 25-token hops after upstream's
first hop. Process CPU time is the measure on a shared host (wall time is printed too).

    PYTHONPATH=$PWD .venv/bin/python tools/measure_cosyvoice3_batched_flow.py             # reduced, B = 1, 2, 4, 8
    PYTHONPATH=$PWD .venv/bin/python tools/measure_cosyvoice3_batched_flow.py --full --rows 4 --chunks 3 --n-timesteps 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from vllm_omni_token2wav.model_executor.models.cosyvoice3.flow import (  # noqa: E402
    ensure_standin_flow,
    load_flow,
    start_stream,
    stream_chunk,
    stream_chunks,
    upstream_hops,
)


def _timed(fn, *args):  # type: ignore[no-untyped-def]
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.process_time() - cpu, time.perf_counter() - wall


def _one_by_one(flow, work):  # type: ignore[no-untyped-def]
    return [stream_chunk(flow, state, tokens, final=final) for state, tokens, final in work]


def measure(flow, rows: int, chunks: int, hop: int, n_timesteps: int) -> dict:  # type: ignore[no-untyped-def]
    streams = []
    for i in range(rows):
        g = torch.Generator().manual_seed(i)
        prompt_tokens = torch.randint(0, 6561, (1, 50 + 7 * i), generator=g)
        prompt_mel = torch.randn(1, 2 * prompt_tokens.shape[1], 80, generator=g) * 0.5 - 4.0
        spk = torch.randn(1, 192, generator=g)
        tokens = torch.randint(0, 6561, (1, hop * chunks + 128), generator=g)
        state = start_stream(flow, prompt_tokens, prompt_mel, spk, n_timesteps=n_timesteps, noise_seed=i)
        first = next(iter(upstream_hops(prompt_tokens.shape[1]))) + 3
        streams.append({"state": state, "tokens": tokens, "fed": 0, "hops": [first] + [hop] * chunks})
    out = []
    for k in range(chunks):
        work = [(s["state"], s["tokens"][:, s["fed"] : s["fed"] + s["hops"][k]], False) for s in streams]
        solo_first = k % 2 == 0
        if not solo_first:
            batched, b_cpu, b_wall = _timed(stream_chunks, flow, work)
        solo, s_cpu, s_wall = _timed(_one_by_one, flow, work)
        if solo_first:
            batched, b_cpu, b_wall = _timed(stream_chunks, flow, work)
        diff = max(float((a[0] - b[0]).abs().max()) for a, b in zip(solo, batched, strict=True))
        out.append(
            {
                "chunk": k + 1,
                "solo_cpu_s": s_cpu,
                "batched_cpu_s": b_cpu,
                "solo_wall_s": s_wall,
                "batched_wall_s": b_wall,
                "max_abs_diff": diff,
                "frames": int(sum(m.shape[-1] for m, _ in batched)),
            }
        )
        for s, (_, state) in zip(streams, batched, strict=True):
            s["state"], s["fed"] = state, s["fed"] + s["hops"][k]
    steady = out[1:] or out
    return {
        "rows": rows,
        "chunks": out,
        "median_solo_cpu_s": statistics.median(r["solo_cpu_s"] for r in steady),
        "median_batched_cpu_s": statistics.median(r["batched_cpu_s"] for r in steady),
        "max_abs_diff": max(r["max_abs_diff"] for r in out),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="full-size stand-in (default reduced)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--chunks", type=int, default=6, help="chunks per stream (the first, upstream's, excluded)")
    parser.add_argument("--hop", type=int, default=25)
    parser.add_argument("--n-timesteps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    flow = load_flow(ensure_standin_flow(reduced=not args.full, seed=0), device="cpu")
    result = {"full": args.full, "threads": args.threads, "n_timesteps": args.n_timesteps, "hop": args.hop}
    with torch.inference_mode():
        result["runs"] = [measure(flow, b, args.chunks, args.hop, args.n_timesteps) for b in args.rows]
    for run in result["runs"]:
        solo, batched = run["median_solo_cpu_s"], run["median_batched_cpu_s"]
        print(
            f"rows {run['rows']:2d}: solo {solo * 1e3:8.1f} ms CPU, one launch {batched * 1e3:8.1f} ms CPU, "
            f"ratio {solo / batched:5.2f}, max |diff| {run['max_abs_diff']:.1e}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
