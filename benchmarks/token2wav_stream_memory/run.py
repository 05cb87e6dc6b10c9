# SPDX-License-Identifier: Apache-2.0
"""Bytes one active Token2Wav stream holds, against the arithmetic floor, fp32 and the opt-in bf16 caches.

Why: a serving stage keeps one stream state per live request; the estimator's attention cache
dominates it (n_timesteps x depth x 2 CFG x heads x 2 head_dim values per cached mel frame, 1.31 MB
per frame in fp32 at the shipped geometry) and the reference trim keeps prompt + 100 frames. This
script measures, on the stand-in of the shipped geometry (default) with a 10 s prompt:

- the floor: (P + 100) frames x bytes per frame for the estimator, plus the conformer cache, where
  P = prompt mel frames;
- what a stream really holds after it reached the steady state (every tensor of its state counted
  once by storage; what it shares with other streams of its voice, the post-prompt frames the trim
  keeps, reported apart), in fp32 and with `kv_cache_dtype=torch.bfloat16`;
- what bf16 storage does to the audio: max abs and relative L2 difference to the fp32 stream, same
  request, same noise;
- the reference implementation's preallocated estimator scratch (16 step slots x 1000 frames).

    python -m benchmarks.token2wav_stream_memory                 # full size, 10 s prompt
    python -m benchmarks.token2wav_stream_memory --reduced --chunks 3 --json /tmp/m.json

Writes out/token2wav_stream_memory.json (atomically; `--json` elsewhere; the recorded one is
benchmarks/results/token2wav_stream_memory.json) and prints
a table. Timings are incidental (single run), the byte counts are exact.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

import torch

from vllm_omni_token2wav.benchmarks.bench_cli import invoked_command
from vllm_omni_token2wav.benchmarks.common import load_average, publish_json_and_text, run_environment, torch_threads
from vllm_omni_token2wav.model_executor.layers.flow.kv_cache import EstimatorKV
from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import ensure_standin_token2wav_dir
from vllm_omni_token2wav.model_executor.models.token2wav_core.stage_backend import CosyVoice2Voice
from vllm_omni_token2wav.model_executor.models.token2wav_core.stream import stream_chunks
from vllm_omni_token2wav.model_executor.models.token2wav_core.synthesis import open_stream, stream_chunk
from vllm_omni_token2wav.model_executor.models.token2wav_stage.stage_model import Token2WavStageModel

MB = 1_000_000  # decimal megabytes, as the issue counts (1.31 MB per cached frame)
REFERENCE_SCRATCH_SLOTS = 16
REFERENCE_SCRATCH_FRAMES = 1000


def _geometry(stage: Token2WavStageModel, n_timesteps: int) -> dict[str, Any]:
    flow = stage.token2wav.flow
    est = flow.decoder.estimator
    enc = flow.encoder
    layers = len(enc.encoders) + len(enc.up_encoders)
    attn = enc.encoders[0].self_attn
    estimator_frame = n_timesteps * len(est.blocks) * 2 * est.num_heads * 2 * est.head_dim * 4
    return {
        "n_timesteps": n_timesteps,
        "depth": len(est.blocks),
        "heads": est.num_heads,
        "head_dim": est.head_dim,
        "estimator_bytes_per_frame_fp32": estimator_frame,
        "conformer_bytes_per_frame_fp32": layers * attn.h * 2 * attn.d_k * 4,
        "reference_scratch_bytes": REFERENCE_SCRATCH_SLOTS * estimator_frame // n_timesteps * REFERENCE_SCRATCH_FRAMES,
    }


def _variant(voice: CosyVoice2Voice, dtype: torch.dtype | None) -> CosyVoice2Voice:
    if dtype is None:
        return voice
    kv = EstimatorKV.from_setup(voice.setup.estimator_att.materialize(), dtype)
    return dataclasses.replace(voice, setup=dataclasses.replace(voice.setup, estimator_att=kv))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav import MiniCPMO45Code2Wav

    folder = ensure_standin_token2wav_dir(reduced=args.reduced, seed=0)
    stage = MiniCPMO45Code2Wav(
        model=str(folder), device="cpu", n_timesteps=args.n_timesteps, reference_seconds=args.prompt_seconds
    )
    start = time.perf_counter()
    stage.load_weights([])
    _, voice = stage.executor.voice(None)  # the default voice normalised to the prompt length, post-prompt state
    setup_s = time.perf_counter() - start
    assert isinstance(voice, CosyVoice2Voice)
    core, backend = stage.token2wav, stage.backend
    geometry = _geometry(stage, args.n_timesteps)
    prompt = voice.setup.prompt_frames
    tail = voice.setup.tail_frames
    tokens = torch.randint(0, 6561, (25 * args.chunks + 3,), generator=torch.Generator().manual_seed(0)).tolist()
    chunks = list(stream_chunks(tokens))[: args.chunks]
    out: dict[str, Any] = {"geometry": geometry, "prompt_frames": prompt, "tail_frames": tail, "setup_s": setup_s}
    audio: dict[str, torch.Tensor] = {}
    for name, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        variant = _variant(voice, dtype)
        caches = open_stream(core.flow, variant.setup, variant.features, seed=1, vocoder=core.stream_vocoder)
        pieces, per_chunk = [], []
        for chunk, _ in chunks:
            t0 = time.perf_counter()
            result = stream_chunk(core.flow, core.stream_vocoder, caches, torch.tensor(chunk), last_chunk=False)
            caches = result.caches
            pieces.append(result.speech)
            usage = backend.stream_bytes(caches, variant)
            per_chunk.append(
                {
                    "seconds": time.perf_counter() - t0,
                    "estimator_frames": caches.flow.estimator_frames,
                    "own_bytes": usage.own,
                    "shared_bytes": usage.shared,
                    "estimator_own_bytes": caches.flow.estimator_att.own_nbytes,
                    "conformer_bytes": caches.flow.conformer_att.numel() * 4,
                }
            )
            print(
                f"{name} chunk {len(per_chunk)}: {per_chunk[-1]['seconds']:.1f} s, own {usage.own / MB:.1f} MB",
                flush=True,
            )
        audio[name] = torch.cat(pieces, dim=1)[0]
        out[name] = {"per_chunk": per_chunk, "steady_own_bytes": per_chunk[-1]["own_bytes"]}
        out[name]["steady_shared_bytes"] = per_chunk[-1]["shared_bytes"]
    diff = (audio["bf16"] - audio["fp32"]).double()
    out["bf16_vs_fp32_audio"] = {
        "max_abs": float(diff.abs().max()),
        "rel_l2": float(diff.norm() / audio["fp32"].double().norm()),
        "fp32_peak": float(audio["fp32"].abs().max()),
        "samples": int(diff.numel()),
    }
    per_frame = geometry["estimator_bytes_per_frame_fp32"]
    out["floor_fp32_bytes"] = {
        "estimator": (prompt + tail) * per_frame,
        "conformer": (prompt + tail) * geometry["conformer_bytes_per_frame_fp32"],
        "estimator_own_if_post_prompt_shared": (prompt + tail - min(prompt, tail)) * per_frame,
    }
    return out


def render(result: dict[str, Any]) -> str:
    g, floor = result["geometry"], result["floor_fp32_bytes"]
    p, t = result["prompt_frames"], result["tail_frames"]
    lines = [
        f"token2wav stream memory: {result['kind']}, {result['prompt_seconds']:g} s prompt (P = {p} mel frames), "
        f"n_timesteps {g['n_timesteps']}, depth {g['depth']}, {g['heads']} heads x {g['head_dim']}",
        f"estimator cache per frame (fp32): {g['estimator_bytes_per_frame_fp32'] / MB:.3f} MB; floor (P + {t} frames): "
        f"{floor['estimator'] / MB:.1f} MB, of which the last {min(p, t)} post-prompt frames are shared per voice "
        f"-> {floor['estimator_own_if_post_prompt_shared'] / MB:.1f} MB own; "
        f"conformer {floor['conformer'] / MB:.1f} MB",
        f"reference scratch (16 slots x 1000 frames, preallocated): {g['reference_scratch_bytes'] / MB:.0f} MB",
        f"{'storage':<8}{'own MB':>9}{'shared MB':>11}{'estimator own MB':>18}{'conformer MB':>14}",
    ]
    for name in ("fp32", "bf16"):
        last = result[name]["per_chunk"][-1]
        lines.append(
            f"{name:<8}{last['own_bytes'] / MB:>9.1f}{last['shared_bytes'] / MB:>11.1f}"
            f"{last['estimator_own_bytes'] / MB:>18.1f}{last['conformer_bytes'] / MB:>14.1f}"
        )
    d = result["bf16_vs_fp32_audio"]
    lines.append(
        f"bf16 caches vs fp32, same request: audio max abs {d['max_abs']:.2e} (peak {d['fp32_peak']:.2f}), "
        f"rel L2 {d['rel_l2']:.2e} over {d['samples']} samples"
    )
    return "\n".join(lines) + "\n"


def execute(args: argparse.Namespace) -> int:
    """The run `python -m benchmarks.token2wav_stream_memory` starts (its options: `cli.py` beside this module)."""
    env = run_environment(torch.device("cpu"), args.threads)
    with torch_threads(args.threads), torch.inference_mode():
        result = run(args)
    env["loadavg_end"] = load_average()
    result = {
        "schema": "vllm-omni/token2wav-stream-memory/1",
        "command": invoked_command(),
        "kind": "stand-in (reduced size)" if args.reduced else "stand-in (full size: the shipped geometry)",
        "prompt_seconds": args.prompt_seconds,
        "environment": env,
        **result,
    }
    text = render(result)
    publish_json_and_text(result, text, args.json)
    return 0
