#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Speed of the in-tree HiFT vocoder and speech tokenizer v2 on full-size stand-ins.

Why: the design doc claims (a) folding weight norm at load removes per-call cost from the vocoder
and (b) the in-tree tokenizer can replace the upstream CPU onnxruntime session. This measures both
side by side on one machine, together with HiFT's real-time factor:

- HiFT: folded vs parametrised weight norm (torch's `parametrizations.weight_norm`), `--hift-seconds`
  of mel, RTF = compute time / audio time;
- tokenizer: in-tree torch model on `--device` (front end on the same device) vs the CPU onnxruntime
  session of the same stand-in file (front end in torch on the CPU), on the shipped real speech clip
  tiled to `--tokenizer-seconds`; tokens are checked equal on every run.

Timing: the variants run interleaved (A, B, A, B, ...) after two warm-ups, so load changes on a shared
machine hit both alike; the table reports medians and ratios. `os.getloadavg()` is recorded before and
after: compare runs only at similar load.

    .venv/bin/python benchmarks/vocoder_tokenizer.py
    .venv/bin/python benchmarks/vocoder_tokenizer.py --device cuda --hift-seconds 10 --repeats 10

Full-size stand-ins are generated on first use under `vllm_omni_token2wav.envs.cache_dir("standins")`
(hift ~83 MB, tokenizer ~495 MB; the tokenizer export takes ~30 s once).
Writes benchmarks/results/vocoder_tokenizer.json (atomically).
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

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from vllm_omni_token2wav import platforms  # noqa: E402
from vllm_omni_token2wav.assets.audio import speech_sample  # noqa: E402
from vllm_omni_token2wav.model_executor.models.cosyvoice2.hift import cached_standin_hift, load_hift  # noqa: E402
from vllm_omni_token2wav.model_executor.models.cosyvoice2.speech_tokenizer import (  # noqa: E402
    cached_standin_speech_tokenizer,
    select_speech_tokenizer,
)

RESULTS = REPO / "benchmarks" / "results" / "vocoder_tokenizer.json"


def _interleaved(cases: dict[str, Callable[[], Any]], sync: Callable[[], None], repeats: int) -> dict[str, float]:
    for fn in cases.values():
        fn()
        fn()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            sync()
            start = time.perf_counter()
            fn()
            sync()
            samples[name].append((time.perf_counter() - start) * 1000.0)
    return {name: statistics.median(v) for name, v in samples.items()}


def measure_hift(device: torch.device, seconds: float, repeats: int, sync: Callable[[], None]) -> dict[str, Any]:
    path = cached_standin_hift(reduced=False, seed=0)
    folded = load_hift(path, device=device)
    unfolded = load_hift(path, device=device, fold_weight_norm=False)
    frames = int(seconds * 50)
    mel = torch.randn(1, 80, frames, generator=torch.Generator().manual_seed(0)).to(device)

    def run(model: torch.nn.Module) -> Callable[[], Any]:
        def call() -> Any:
            with torch.inference_mode():
                return model(mel)

        return call

    medians = _interleaved({"folded": run(folded), "parametrised": run(unfolded)}, sync, repeats)
    audio_ms = frames * 480 / 24000 * 1000.0
    return {
        "audio_seconds": audio_ms / 1000.0,
        "folded_ms": medians["folded"],
        "parametrised_ms": medians["parametrised"],
        "folded_speedup": medians["parametrised"] / medians["folded"],
        "rtf_folded": medians["folded"] / audio_ms,
    }


def measure_tokenizer(device: torch.device, seconds: float, repeats: int, sync: Callable[[], None]) -> dict[str, Any]:
    path = cached_standin_speech_tokenizer(reduced=False, seed=0)
    torch_backend = select_speech_tokenizer(path, backend="torch", device=device)
    ort_backend = select_speech_tokenizer(path, backend="onnx")
    speech, _ = speech_sample()
    wav = torch.from_numpy(np.resize(speech, int(seconds * 16000)).astype(np.float32))
    tokens_torch = torch_backend.tokenize(wav.to(device))[0].cpu()
    tokens_ort = ort_backend.tokenize(wav)[0]
    medians = _interleaved(
        {"torch": lambda: torch_backend.tokenize(wav.to(device)), "onnx": lambda: ort_backend.tokenize(wav)},
        sync,
        repeats,
    )
    return {
        "audio_seconds": seconds,
        "tokens": int(tokens_torch.shape[1]),
        "tokens_identical": bool(torch.equal(tokens_torch, tokens_ort)),
        "torch_ms": medians["torch"],
        "onnx_cpu_ms": medians["onnx"],
        "torch_speedup": medians["onnx"] / medians["torch"],
    }


def _write_atomic(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="device spec (default: the serving platform's device)")
    parser.add_argument("--hift-seconds", type=float, default=2.0, help="seconds of audio per HiFT call")
    parser.add_argument("--tokenizer-seconds", type=float, default=4.0, help="seconds of speech per tokenize call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    device = platforms.normalize_device(args.device)
    plat = platforms.current_omni_platform

    def sync() -> None:
        if device.type != "cpu":
            plat.synchronize(device)

    load_before = os.getloadavg()
    hift = measure_hift(device, args.hift_seconds, args.repeats, sync)
    tokenizer = measure_tokenizer(device, args.tokenizer_seconds, args.repeats, sync)
    load_after = os.getloadavg()

    print(f"device {device} ({plat.device_name}), torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    print()
    print(f"HiFT (full-size stand-in, {hift['audio_seconds']:.1f} s of audio per call)")
    print("| variant              | median ms | RTF    |")
    print("|----------------------|-----------|--------|")
    for name in ("folded", "parametrised"):
        ms = hift[f"{name}_ms"]
        print(f"| weight norm {name:<8} | {ms:9.1f} | {ms / (hift['audio_seconds'] * 1000):6.3f} |")
    print(f"folded speedup x{hift['folded_speedup']:.2f}")
    print()
    print(f"Speech tokenizer v2 (full-size stand-in, {tokenizer['audio_seconds']:.1f} s real speech)")
    print("| backend             | median ms |")
    print("|---------------------|-----------|")
    print(f"| torch on {device.type:<10} | {tokenizer['torch_ms']:9.1f} |")
    print(f"| onnxruntime CPU     | {tokenizer['onnx_cpu_ms']:9.1f} |")
    print(f"torch speedup x{tokenizer['torch_speedup']:.2f}; tokens identical: {tokenizer['tokens_identical']}")

    _write_atomic(
        args.output,
        {
            "device": str(device),
            "device_name": plat.device_name,
            "host": host_platform.node(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "repeats": args.repeats,
            "hift": hift,
            "tokenizer": tokenizer,
        },
    )
    print(f"wrote {args.output}")
    return 0 if tokenizer["tokens_identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
