# SPDX-License-Identifier: Apache-2.0
"""End-to-end cost of `prepare_prompt` (the Token2Wav request path of a reference voice).

Why: the facade decides where the speaker embedding runs (ORT CPU fallback vs the device path)
and caches prompt features by content. This measures, per prompt length (3 / 6 / 10 s of real
speech, the shipped clip repeated), the whole `prepare_prompt` call — decode/normalise, resample
to 16 and 24 kHz, fbank, CAM++, 24 kHz mel — for:

- `ort`: the ORT CPU fallback (upstream behaviour), cache disabled;
- `device`: `enable_device_spk_embedding()` on this platform's device, cache disabled;
- `torch`: the torch CAM++ on the facade's device (differs from `device` only where the
  recorded CPU policy picks ORT, or on CUDA with TensorRT), cache disabled;
- `hit`: a warm cache (the cost every repeated voice pays: digest + lookup + clone);
- `lookup`: the cache lookup + clone alone, for an already computed digest.

Timing: the cases run interleaved (ort, device, torch, hit, ...) so load changes on a shared machine
hit all alike; medians over `--repeats` (>= 20) calls; `os.getloadavg()` before and after. Compare
runs only at similar load. On CPU both ORT (1 intra-op thread, upstream) and torch use the threads
shown in the JSON (`torch_threads`).

    python -m benchmarks.prompt_path --repeats 20
    python -m benchmarks.prompt_path --model-dir /path/to/token2wav --seconds 3 6 10

Without `--model-dir` the deterministic full-size stand-in campplus.onnx is used (same network
size as the real file; the numbers are about cost, not voice quality).
Writes out/prompt_path.json by default (the recorded one: benchmarks/results/prompt_path.json) (atomically).
"""

from __future__ import annotations

import argparse
import json
import os
import platform as host_platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vllm_omni_token2wav import platforms
from vllm_omni_token2wav.assets.audio import speech_sample
from vllm_omni_token2wav.benchmarks.bench_cli import invoked_command
from vllm_omni_token2wav.cli_types import CLIUsageError
from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav import StepAudio2Token2WavCore


def _prompt_of(seconds: float, speech: np.ndarray, rate: int) -> tuple[np.ndarray, int]:
    reps = int(np.ceil(seconds * rate / speech.shape[0]))
    return np.tile(speech, reps)[: int(seconds * rate)].copy(), rate


def _standin_dir() -> Path:
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )

    root = Path(tempfile.mkdtemp(prefix="prompt_path_"))
    os.symlink(ensure_standin_campplus_onnx(), root / "campplus.onnx")
    return root


def _timed_ms(fn: Callable[[], Any], sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - start) * 1e3


def measure(model_dir: Path, seconds: list[float], repeats: int) -> list[dict[str, Any]]:
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import get_campplus_torch

    platform = platforms.current_omni_platform
    device = platform.torch_device()

    def sync() -> None:
        platform.synchronize()

    ort = StepAudio2Token2WavCore(model_dir, device=device, prompt_cache_size=0)
    dev = StepAudio2Token2WavCore(model_dir, device=device, prompt_cache_size=0)
    dev.enable_device_spk_embedding()
    tch = StepAudio2Token2WavCore(model_dir, device=device, prompt_cache_size=0)
    tch.install_spk_backend(get_campplus_torch(model_dir / "campplus.onnx", device))
    cached = StepAudio2Token2WavCore(model_dir, device=device, prompt_cache_size=8)
    cached.install_spk_backend(dev.spk_model)

    speech, rate = speech_sample()
    rows = []
    for sec in seconds:
        prompt = _prompt_of(sec, speech, rate)
        for core in (ort, dev, tch, cached):  # warm-up: sessions, engines, constants, the cache entry
            core.prepare_prompt(prompt)
        # the facade keys its cache by (digest, speaker backend, speech tokenizer or None without tokens)
        digest_key = (cached.prepare_prompt(prompt).digest, cached.spk_backend, None)
        cases: dict[str, Callable[[], Any]] = {
            "ort": lambda p=prompt: ort.prepare_prompt(p),
            "device": lambda p=prompt: dev.prepare_prompt(p),
            "torch": lambda p=prompt: tch.prepare_prompt(p),
            "hit": lambda p=prompt: cached.prepare_prompt(p),
            "lookup": lambda k=digest_key: cached.speaker_prompt.cache.get_or_compute(k, _never),
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(repeats):
            for name, fn in cases.items():
                times[name].append(_timed_ms(fn, sync))
        med = {name: statistics.median(values) for name, values in times.items()}
        rows.append(
            {
                "seconds": sec,
                "device_backend": dev.spk_backend,
                "torch_backend": tch.spk_backend,
                **{f"{name}_ms": med[name] for name in cases},
                "ort_over_device": med["ort"] / med["device"],
                "ort_over_torch": med["ort"] / med["torch"],
                "ort_over_hit": med["ort"] / med["hit"],
            }
        )
    return rows


def _never() -> Any:
    raise RuntimeError("prompt_path benchmark: the lookup case missed the cache")


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def execute(args: argparse.Namespace) -> int:
    """The run `python -m benchmarks.prompt_path` starts (its options: `cli.py` beside this module)."""
    if args.repeats < 20:
        raise CLIUsageError("--repeats must be >= 20 (medians of fewer calls are too noisy on shared hosts)")
    if args.model_dir is not None and not (args.model_dir / "campplus.onnx").is_file():
        raise CLIUsageError(f"{args.model_dir} has no campplus.onnx")
    model_dir = args.model_dir if args.model_dir is not None else _standin_dir()
    load_before = os.getloadavg()
    rows = measure(model_dir, args.seconds, args.repeats)
    load_after = os.getloadavg()
    load = f"load {load_before[0]:.2f} -> {load_after[0]:.2f}"
    print(f"prompt_path: median ms of {args.repeats} interleaved calls, {load}")
    names = ("ort", "device", "torch", "hit", "lookup", "ort/dev", "ort/hit")
    header = f"{'prompt':>7} " + " ".join(f"{n:>9}" for n in names)
    print(f"{header}   device backend")
    for r in rows:
        print(
            f"{r['seconds']:>6.1f}s {r['ort_ms']:>9.2f} {r['device_ms']:>9.2f} {r['torch_ms']:>9.2f} "
            f"{r['hit_ms']:>9.3f} {r['lookup_ms']:>9.3f} {r['ort_over_device']:>9.2f} {r['ort_over_hit']:>9.1f}"
            f"   {r['device_backend']}"
        )
    platform = platforms.current_omni_platform
    _write_json(
        args.json,
        {
            "benchmark": "prompt_path",
            "command": invoked_command(),
            "model_dir": str(args.model_dir) if args.model_dir is not None else "stand-in campplus.onnx (full size)",
            "device": str(platform.torch_device()),
            "device_name": platform.device_name,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "onnxruntime": __import__("onnxruntime").__version__,
            "host": host_platform.platform(),
            "cpu_count": os.cpu_count(),
            "loadavg_before": list(load_before),
            "loadavg_after": list(load_after),
            "repeats": args.repeats,
            "rows": rows,
        },
    )
    print(f"wrote {args.json}")
    return 0
