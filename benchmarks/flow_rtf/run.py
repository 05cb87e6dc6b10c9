# SPDX-License-Identifier: Apache-2.0
"""Speed of the in-tree flow model (conformer encoder + DiT + CFM) at full size: mel frames/s and RTF.

Why: the flow model is most of the Token2Wav stage's compute (16 DiT blocks x n Euler steps x 2 CFG
branches); this records what it costs on the platform device, whole-utterance and streaming, for the
step counts in use (10 upstream, 5 in some demos), fp32 and fp16 where the device supports it.

RTF = compute seconds / audio seconds (50 mel frames = 1 s of 24 kHz audio). Streaming runs the
reference driver: `setup_cache` once (timed separately, it is per prompt), then chunks of 25 tokens +
3 lookahead (the last chunk without), estimator cache trimmed to prompt + 100 frames; its RTF counts
the chunks only, and the first chunk's latency is reported. Weights are seeded random (same cost as
the real ones). Cases run interleaved (case A run 1, case B run 1, ..., A run 2, ...) so load changes
on a shared machine hit all alike; the table shows medians of `--runs` runs. `os.getloadavg()` is
recorded before and after.

    python -m benchmarks.flow_rtf                        # platform device, defaults below
    python -m benchmarks.flow_rtf --gen-seconds 10 --prompt-seconds 3 --runs 5   # accelerator

Defaults: 10 s generated + 3 s prompt on an accelerator; 2 s + 1 s on CPU (a full-size step over
13 s of audio takes minutes there). Writes out/flow_rtf.json (atomically; `--json` elsewhere; the
recorded one is benchmarks/results/flow_rtf.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform as host_platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from vllm_omni_token2wav import platforms
from vllm_omni_token2wav.cli_types import CLIUsageError
from vllm_omni_token2wav.model_executor.layers.flow import (
    REAL_FLOW_CONFIG,
    REDUCED_FLOW_CONFIG,
    CausalMaskedDiffWithXvec,
    Lookahead,
    build_flow,
    standin_state_dict,
)

FRAMES_PER_SECOND = 50
TOKENS_PER_SECOND = 25
CHUNK, LOOKAHEAD = 25, 3


def _model(config: dict[str, Any], dtype: torch.dtype, device: torch.device) -> CausalMaskedDiffWithXvec:
    model = build_flow(config).eval()
    model.load_state_dict(standin_state_dict(model, seed=0))
    if dtype == torch.float16:
        model.half()
    return model.to(device)


def _inputs(prompt_tokens: int, gen_tokens: int, device: torch.device) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "prompt_tokens": torch.randint(0, 6561, (1, prompt_tokens), generator=g).to(device),
        "prompt_mel": (torch.randn(1, 2 * prompt_tokens, 80, generator=g) * 0.5 - 4.0).to(device),
        "spk": torch.randn(1, 192, generator=g).to(device),
        "tokens": torch.randint(0, 6561, (1, gen_tokens), generator=g).to(device),
    }


def _whole(model: CausalMaskedDiffWithXvec, x: dict[str, torch.Tensor], n: int) -> Callable[[], dict[str, float]]:
    tok, pt, pm = x["tokens"], x["prompt_tokens"], x["prompt_mel"]
    lens = [torch.tensor([v.size(1)], device=v.device) for v in (tok, pt, pm)]

    def run() -> dict[str, float]:
        start = time.perf_counter()
        model.inference(tok, lens[0], pt, lens[1], pm, lens[2], x["spk"], n)
        platforms.current_omni_platform.synchronize()
        return {"compute_s": time.perf_counter() - start}

    return run


def _stream(model: CausalMaskedDiffWithXvec, x: dict[str, torch.Tensor], n: int) -> Callable[[], dict[str, float]]:
    tok = x["tokens"]

    def run() -> dict[str, float]:
        sync = platforms.current_omni_platform.synchronize
        start = time.perf_counter()
        cache = model.setup_cache(x["prompt_tokens"], x["prompt_mel"], x["spk"], n, lookahead=Lookahead.PROMPT_HEAD)
        sync()
        setup_s = time.perf_counter() - start
        chunk_times, pos, total = [], 0, tok.size(1)
        while True:
            last = total - pos <= CHUNK + LOOKAHEAD
            chunk = tok[:, pos:] if last else tok[:, pos : pos + CHUNK + LOOKAHEAD]
            start = time.perf_counter()
            _, cache = model.inference_chunk(chunk, x["spk"], cache, last, n)
            sync()
            chunk_times.append(time.perf_counter() - start)
            if last:
                break
            pos += CHUNK
        return {"compute_s": sum(chunk_times), "setup_s": setup_s, "first_chunk_s": chunk_times[0]}

    return run


def execute(args: argparse.Namespace) -> int:
    """The run `python -m benchmarks.flow_rtf` starts (its options: `cli.py` beside this module)."""
    platform = platforms.current_omni_platform
    device = torch.device(args.device) if args.device else platform.torch_device()
    on_cpu = device.type == "cpu"
    gen_s = args.gen_seconds if args.gen_seconds is not None else (2.0 if on_cpu else 10.0)
    prompt_s = args.prompt_seconds if args.prompt_seconds is not None else (1.0 if on_cpu else 3.0)
    dtypes = args.dtypes or (["fp32"] if on_cpu else ["fp32", "fp16"])
    if args.runs < 1:
        raise CLIUsageError("--runs must be >= 1")
    if args.threads is not None:
        torch.set_num_threads(args.threads)  # CLI process: its own thread count is the user's choice
    gen_tokens, prompt_tokens = round(gen_s * TOKENS_PER_SECOND), round(prompt_s * TOKENS_PER_SECOND)
    config = REAL_FLOW_CONFIG if args.config == "real" else REDUCED_FLOW_CONFIG
    x = _inputs(prompt_tokens, gen_tokens, device)
    audio_s = 2 * gen_tokens / FRAMES_PER_SECOND
    cases: dict[str, tuple[dict[str, Any], Callable[[], dict[str, float]]]] = {}
    models = {}
    for name in dtypes:
        models[name] = _model(config, torch.float32 if name == "fp32" else torch.float16, device)
        for n in args.timesteps:
            for mode in args.modes:
                make = _whole if mode == "whole" else _stream
                cases[f"{mode}/{name}/n{n}"] = (
                    {"mode": mode, "dtype": name, "n_timesteps": n},
                    make(models[name], x, n),
                )
    load_before = os.getloadavg()
    for _, run in cases.values():  # warm-up (allocator, kernels)
        run()
    samples: dict[str, list[dict[str, float]]] = {key: [] for key in cases}
    for _ in range(args.runs):
        for key, (_, run) in cases.items():
            samples[key].append(run())
    load_after = os.getloadavg()
    rows = []
    for key, (meta, _) in cases.items():
        med = {field: statistics.median(s[field] for s in samples[key]) for field in samples[key][0]}
        rows.append(
            {
                **meta,
                "median_compute_s": med["compute_s"],
                "rtf": med["compute_s"] / audio_s,
                "mel_frames_per_s": 2 * gen_tokens / med["compute_s"],
                "median_setup_s": med.get("setup_s"),
                "median_first_chunk_s": med.get("first_chunk_s"),
                "runs_compute_s": [s["compute_s"] for s in samples[key]],
            }
        )
    print(
        f"flow model ({args.config}) on {device} ({platform.device_name}); {gen_s:g} s generated + {prompt_s:g} s "
        f"prompt; median of {args.runs}; loadavg {load_before[0]:.1f} -> {load_after[0]:.1f}"
    )
    print(
        f"{'mode':<7}{'dtype':<6}{'n':>3}{'compute s':>11}{'RTF':>8}{'frames/s':>10}{'setup s':>9}{'1st chunk s':>12}"
    )
    for r in rows:
        setup = f"{r['median_setup_s']:.3f}" if r["median_setup_s"] is not None else "-"
        first = f"{r['median_first_chunk_s']:.3f}" if r["median_first_chunk_s"] is not None else "-"
        print(
            f"{r['mode']:<7}{r['dtype']:<6}{r['n_timesteps']:>3}{r['median_compute_s']:>11.3f}{r['rtf']:>8.3f}"
            f"{r['mel_frames_per_s']:>10.1f}{setup:>9}{first:>12}"
        )
    result = {
        "benchmark": "flow_rtf",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "config": args.config,
        "device": str(device),
        "device_name": platform.device_name,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "host": host_platform.node(),
        "cpu_count": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "generated_seconds": gen_s,
        "prompt_seconds": prompt_s,
        "runs": args.runs,
        "results": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=args.json.parent, prefix=f".{args.json.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(result, f, indent=2)
    os.replace(tmp, args.json)
    print(f"wrote {args.json}")
    return 0
