# SPDX-License-Identifier: Apache-2.0
"""Benchmark and agreement report of the torch audio front end (Kaldi fbank, 24 kHz prompt mel).

Why: upstream computes the CAM++ fbank on the CPU (torchaudio) and copies it to the device; this
measures what the in-tree torch fbank costs on the platform device against kaldi-native-fbank on
the CPU (plus the host->device copy of its features, which the CPU path needs when a device exists),
and records the numerical agreement the design doc quotes.

kaldi-native-fbank is timed as a Python caller uses it (list input, one get_frame call per frame),
batch 8 as 8 sequential calls (it has no batch API). "speedup" is knf time / torch "fft" time.

Timing: for each case the implementations run interleaved (A, B, A, B, ...) so that load changes on
a shared machine hit both alike; the table reports medians and the ratio. `os.getloadavg()` is
recorded before and after: compare runs only at similar load.

    python -m benchmarks.audio_frontend --repeats 20
    python -m benchmarks.audio_frontend --device cpu --durations 2 10 --batches 1

Writes out/audio_frontend.json by default (the recorded one: benchmarks/results/audio_frontend.json) (atomically).
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
from vllm_omni_token2wav.model_executor.models.audio import kaldi_fbank, prompt_mel_24k, resample


def _knf_fbank(samples: np.ndarray) -> np.ndarray:
    import kaldi_native_fbank as knf

    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0.0
    opts.frame_opts.samp_freq = 16000.0
    opts.mel_opts.num_bins = 80
    fbank = knf.OnlineFbank(opts)
    fbank.accept_waveform(16000.0, samples.tolist())
    fbank.input_finished()
    return np.stack([np.asarray(fbank.get_frame(i)) for i in range(fbank.num_frames_ready)]).astype(np.float32)


def _speech_of(seconds: float, speech: np.ndarray, seed: int) -> np.ndarray:
    """`seconds` of real speech: the shipped clip tiled, with a little noise so tiles differ."""
    n = int(seconds * 16000)
    tiled = np.resize(speech, n)
    return (tiled + 1e-4 * np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


def _timed(fn: Callable[[], Any], sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - start) * 1000.0


def _interleaved(cases: dict[str, Callable[[], Any]], sync: Callable[[], None], repeats: int) -> dict[str, float]:
    for fn in cases.values():  # warm-up: constant caches, kernels, allocator
        fn()
        fn()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            samples[name].append(_timed(fn, sync))
    return {name: statistics.median(v) for name, v in samples.items()}


def measure_speed(
    device: torch.device, durations: list[float], batches: list[int], repeats: int
) -> list[dict[str, Any]]:
    speech, _ = speech_sample()
    plat = platforms.current_omni_platform
    on_device = device.type != "cpu"

    def sync() -> None:
        if on_device:
            plat.synchronize(device)

    rows = []
    for seconds in durations:
        for batch in batches:
            host = [_speech_of(seconds, speech, seed=i) for i in range(batch)]
            host_batch = torch.from_numpy(np.stack(host))
            dev_batch = host_batch.to(device)

            def ours(dev_batch: torch.Tensor = dev_batch) -> torch.Tensor:
                return kaldi_fbank(dev_batch, check_finite=False, dft_impl="fft")

            def ours_matmul(dev_batch: torch.Tensor = dev_batch) -> torch.Tensor:
                return kaldi_fbank(dev_batch, check_finite=False, dft_impl="matmul")

            def reference(host: list[np.ndarray] = host) -> Any:
                feats = [_knf_fbank(x) for x in host]
                if on_device:  # the CPU path must copy its features to the device afterwards
                    return [torch.from_numpy(f).to(device, non_blocking=False) for f in feats]
                return feats

            medians = _interleaved({"torch": ours, "torch_matmul": ours_matmul, "knf": reference}, sync, repeats)
            rows.append(
                {
                    "seconds": seconds,
                    "batch": batch,
                    "torch_ms": medians["torch"],
                    "torch_matmul_ms": medians["torch_matmul"],
                    "knf_ms" + ("_plus_h2d" if on_device else ""): medians["knf"],
                    "speedup": medians["knf"] / medians["torch"],
                }
            )
    return rows


def measure_agreement() -> dict[str, Any]:
    """Max / mean |diff| of log fbank vs kaldi-native-fbank and of the prompt mel vs librosa + numpy float64."""
    speech, _ = speech_sample()
    t = np.arange(16000) / 16000
    signals = {
        "speech": speech,
        "white_noise": (0.1 * np.random.default_rng(0).standard_normal(16000)).astype(np.float32),
        "tone_440": (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32),
        "silence": np.zeros(16000, dtype=np.float32),
        "clipped_speech": np.clip(speech * 8.0, -1, 1).astype(np.float32),
        "dc_offset_speech": (speech * 0.1 + 0.9).astype(np.float32),
    }
    fbank: dict[str, Any] = {}
    for name, x in signals.items():
        ref = _knf_fbank(x)
        for impl in ("fft", "matmul"):
            diff = np.abs(kaldi_fbank(torch.from_numpy(x), dft_impl=impl).numpy() - ref)
            fbank[f"{name}/{impl}"] = {"max_abs": float(diff.max()), "mean_abs": float(diff.mean())}
    mel: dict[str, Any] = {}
    try:
        import librosa
    except ImportError:
        librosa = None
    if librosa is not None:
        basis = librosa.filters.mel(sr=24000, n_fft=1920, n_mels=80, fmin=0, fmax=8000, dtype=np.float64)
        window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(1920) / 1920)
        for name, x16 in (("speech", speech), ("white_noise", signals["white_noise"])):
            x = resample(x16, 16000, 24000)
            padded = np.pad(x.astype(np.float64), (720, 720), mode="reflect")
            count = 1 + (len(padded) - 1920) // 480
            frames = padded[np.arange(count)[:, None] * 480 + np.arange(1920)[None, :]] * window
            spec = np.fft.rfft(frames, axis=1)
            ref = np.log(np.maximum(np.sqrt(spec.real**2 + spec.imag**2 + 1e-9) @ basis.T, 1e-5))
            for impl in ("fft", "matmul"):
                diff = np.abs(prompt_mel_24k(torch.from_numpy(x), dft_impl=impl)[0].numpy() - ref)
                mel[f"{name}/{impl}"] = {"max_abs": float(diff.max()), "mean_abs": float(diff.mean())}
    return {"fbank_vs_kaldi_native_fbank": fbank, "prompt_mel_vs_librosa_numpy_f64": mel}


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def execute(args: argparse.Namespace) -> int:
    """The run `python -m benchmarks.audio_frontend` starts (its options: `cli.py` beside this module)."""
    if args.repeats < 1:
        raise CLIUsageError("--repeats must be >= 1")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device) if args.device else platforms.current_omni_platform.torch_device()
    load_before = os.getloadavg()
    rows = measure_speed(device, args.durations, args.batches, args.repeats)
    agreement = measure_agreement()
    load_after = os.getloadavg()
    ref_key = "knf_ms_plus_h2d" if device.type != "cpu" else "knf_ms"
    print(f"fbank (80 bins, 16 kHz), device {device}, torch threads {args.threads}, median of {args.repeats}")
    print(f"{'audio':>7} {'batch':>5} {'torch fft ms':>13} {'torch matmul ms':>16} {ref_key:>16} {'speedup':>8}")
    for r in rows:
        print(
            f"{r['seconds']:>6g}s {r['batch']:>5} {r['torch_ms']:>13.2f} {r['torch_matmul_ms']:>16.2f} "
            f"{r[ref_key]:>16.2f} {r['speedup']:>7.2f}x"
        )
    print("agreement (max / mean |diff|):")
    for table, entries in agreement.items():
        for name, d in entries.items():
            print(f"  {table:<34} {name:<22} {d['max_abs']:.3g} / {d['mean_abs']:.3g}")
    print(f"load average before {load_before}, after {load_after}")
    _write_json(
        args.json,
        {
            "benchmark": "audio_frontend",
            "command": invoked_command(),
            "device": str(device),
            "device_name": platforms.current_omni_platform.device_name,
            "torch": torch.__version__,
            "torch_threads": args.threads,
            "host": host_platform.platform(),
            "cpu_count": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "repeats": args.repeats,
            "speed": rows,
            "agreement": agreement,
        },
    )
    print(f"wrote {args.json}")
    return 0
