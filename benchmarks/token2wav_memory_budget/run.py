# SPDX-License-Identifier: Apache-2.0
"""What a Token2Wav stage's streams hold per audio second, and long CosyVoice3 replies served under a budget.

Why: issue 32 asks for a memory budget per stage that holds with long replies (CosyVoice3's exact K/V
arena grows 3.6 MB per mel frame at full size in fp32, 180 MB per audio second). Two measurements, on
the reduced stand-ins through the stage classes (`Token2WavStageModel.forward`, the same step executor
the engine drives), one intra-op thread:

1. bytes per audio second, per family (MiniCPM-o 4.5, Step-Audio2, CosyVoice3) and K/V storage dtype
   (fp32, bf16): one reply of `--family-seconds` under a budget that never binds, `backend.stream_bytes`
   after every chunk (measured) against what the budget counts the stream at (its reservation); the
   full-size figure is CosyVoice3's K/V formula at the shipped geometry;
2. `--streams` CosyVoice3 replies of `--seconds` each, arriving one chunk step apart, served together
   under `token2wav_memory_budget` = `--fit` replies' reservation (`token2wav_stream_reserve_s` =
   the reply length), so the others wait: waits, the most the live streams were counted at (never above
   the budget), RSS sampled after every step against the RSS after one reply served alone on the same
   stage (the warm-up: allocator pools and the largest step's activations), and each reply
   compared with the same request served alone (same request id, so the same noise).

    python -m benchmarks.token2wav_memory_budget                    # 60 s replies, c=8, 3 fit
    python -m benchmarks.token2wav_memory_budget --seconds 4 --streams 3 --fit 1 --family-seconds 2

Writes out/token2wav_memory_budget.json and .txt (atomically; `--json` elsewhere); prints the tables.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.token2wav_memory_budget.cli import FAMILIES, KV_DTYPES
from vllm_omni_token2wav.benchmarks.bench_cli import invoked_command
from vllm_omni_token2wav.benchmarks.common import load_average, publish_json_and_text, run_environment, torch_threads
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import REAL_FLOW_CONFIG
from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import (
    ChunkPayload,
    ProducerStream,
    all_chunks,
    forward_inputs,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import segment_errors
from vllm_omni_token2wav.model_executor.models.token2wav_stage.memory_budget import TOKENS_PER_SECOND
from vllm_omni_token2wav.model_executor.models.token2wav_stage.stage_model import Token2WavStageModel

MB = 1_000_000
NEVER_BINDS = 10**15
SAMPLE_RATE = 24_000


def rss_bytes() -> int:
    """This process's resident set now (Linux `/proc/self/statm`)."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _token2wav_folder(root: Path) -> Path:
    """A model folder laid out as Step-Audio2 / MiniCPM-o ship it: the reduced stand-in under `token2wav/`."""
    from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import ensure_standin_token2wav_dir

    folder = root / "model"
    if not folder.exists():
        folder.mkdir(parents=True)
        os.symlink(ensure_standin_token2wav_dir(reduced=True), folder / "token2wav")
    return folder


def build_stage(family: str, kv: str, n_timesteps: int, root: Path, **options: Any) -> Token2WavStageModel:
    """The family's stage class on its reduced stand-in, CPU, `kv` K/V storage."""
    common: dict[str, Any] = {"device": "cpu", "n_timesteps": n_timesteps, "kv_cache_dtype": kv, **options}
    if family == "cosyvoice3":
        from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_code2wav import CosyVoice3Code2Wav
        from vllm_omni_token2wav.model_executor.models.standin.cosyvoice3_dir import ensure_standin_cosyvoice3_dir

        stage: Token2WavStageModel = CosyVoice3Code2Wav(
            model=str(ensure_standin_cosyvoice3_dir(reduced=True)), **common
        )
    elif family == "minicpmo_4_5":
        from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav import MiniCPMO45Code2Wav

        stage = MiniCPMO45Code2Wav(model=str(_token2wav_folder(root)), async_chunk=True, **common)
    else:
        from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav_stage import (
            StepAudio2Token2WavForConditionalGeneration,
        )

        stage = StepAudio2Token2WavForConditionalGeneration(model=str(_token2wav_folder(root)), **common)
    stage.load_weights([])
    return stage


def producer(stage: Token2WavStageModel, rid: str, seconds: float, seed: int) -> list[ChunkPayload]:
    """Every chunk a producer sends for a reply of `seconds` of random codec tokens (seeded)."""
    count = round(seconds * TOKENS_PER_SECOND)
    tokens = torch.randint(0, 6561, (count,), generator=torch.Generator().manual_seed(seed)).tolist()
    prompt = 0
    if stage.family.name == "cosyvoice3":
        prompt = int(stage.default_voice.tokens.shape[1])  # type: ignore[attr-defined]
    return all_chunks(ProducerStream(rid, tokens, stage.family, prompt_tokens=prompt))


def serve(stage: Token2WavStageModel, payloads: list[ChunkPayload]) -> tuple[list[torch.Tensor], list[str | None]]:
    """One engine step of `payloads`: each one's audio and error."""
    input_ids, kwargs = forward_inputs(payloads, stage.family)
    out = stage(input_ids, None, **kwargs).multimodal_outputs
    return list(out[stage.family.output_key]), segment_errors(out)


# ---- 1. bytes per audio second ---------------------------------------------------------------------


def family_bytes(family: str, kv: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    # a budget that never binds: reservations and the arena's cap work as in any deployment with a budget
    stage = build_stage(family, kv, args.n_timesteps, root, memory_budget=NEVER_BINDS)
    _, voice = stage.executor.voice(None)
    estimate = getattr(stage.backend, "estimate_stream_bytes", None)
    samples, held = 0, []
    for payload in producer(stage, "r", args.family_seconds, seed=7):
        audio, errors = serve(stage, [payload])
        if errors != [None]:
            raise RuntimeError(f"{family} ({kv}): {errors}")
        samples += int(audio[0].numel())
        states = stage.streams.states()
        if states:  # before the last chunk ends the stream
            usage = stage.backend.stream_bytes(states[0].caches, states[0].voice)
            tokens = states[0].tokens
            counted = stage.executor.live_bytes() - usage.shared
            held.append((samples / SAMPLE_RATE, usage.own, usage.shared, tokens, counted))
    seconds, own, shared, tokens, counted = held[-1]
    estimated = int(estimate(voice, tokens)) if estimate is not None else None
    row: dict[str, Any] = {
        "family": family,
        "kv_dtype": kv,
        "audio_seconds": round(seconds, 3),
        "own_bytes": own,
        "peak_own_bytes": max(h[1] for h in held),
        "shared_bytes": shared,
        "estimate_bytes": estimated,
        "counted_bytes": counted,
        "own_within_counted_every_chunk": all(h[1] <= h[4] for h in held),
        "bytes_per_audio_second": round(own / seconds) if seconds else None,
        "own_bytes_by_audio_second": [[round(h[0], 2), h[1]] for h in held],
    }
    if family == "cosyvoice3":
        backend = stage.backend
        element = 2 if kv == "bfloat16" else 4
        full = REAL_FLOW_CONFIG
        full_frame = 10 * full.depth * 2 * 2 * full.heads * full.dim_head * element
        ratio = backend.core.flow.config.token_mel_ratio  # type: ignore[attr-defined]
        row["estimate_bytes_per_frame"] = backend.bytes_per_frame  # type: ignore[attr-defined]
        row["arena_bytes_per_frame_measured"] = states_frame_bytes(stage)
        row["full_size_bytes_per_frame"] = full_frame
        row["full_size_bytes_per_audio_second"] = full_frame * ratio * TOKENS_PER_SECOND
    return row


def states_frame_bytes(stage: Token2WavStageModel) -> int | None:
    """The K/V bytes per mel frame of a fresh CosyVoice3 stream after one chunk (measured on its arena)."""
    payloads = producer(stage, "probe", 2.0, seed=8)
    serve(stage, payloads[:1])
    state = stage.streams.get("probe")
    if state is None:
        return None
    arena = state.caches.flow.kv  # type: ignore[attr-defined]
    stage.executor.finish(["probe"])
    return arena.nbytes // arena.capacity if arena.capacity else None


# ---- 2. c=N long CosyVoice3 replies under a budget --------------------------------------------------


def budget_run(args: argparse.Namespace, kv: str, root: Path) -> dict[str, Any]:
    reserve_s = args.seconds + 2.0  # the reply's length, plus the 3 lookahead ids each chunk re-sends
    alone = build_stage("cosyvoice3", kv, args.n_timesteps, root, memory_budget="off")
    _, voice = alone.executor.voice(None)
    per_stream = alone.backend.estimate_stream_bytes(voice, round(reserve_s * TOKENS_PER_SECOND))  # type: ignore[attr-defined]
    budget = args.fit * per_stream + voice.prompt.nbytes + per_stream // 2  # `fit` replies, never fit + 1
    rids = [f"req-{i}" for i in range(args.streams)]
    plans = {rid: producer(alone, rid, args.seconds, seed=100 + i) for i, rid in enumerate(rids)}

    stage = build_stage("cosyvoice3", kv, args.n_timesteps, root, memory_budget=budget, reserve_seconds=reserve_s)
    engine = stage.executor
    # warm-up: one full-length reply alone on this stage, so the allocator already holds what one reply's
    # steps need (its largest step: the full-attention last chunk); RSS above this comes from concurrency
    for payload in producer(stage, "warm-up", args.seconds, seed=99):
        serve(stage, [payload])
    base_rss = rss_bytes()
    peak_rss, peak_counted, max_live, kept_at_peak = base_rss, 0, 0, 0
    audio: dict[str, list[torch.Tensor]] = {rid: [] for rid in rids}
    errors: dict[str, str] = {}
    first_audio_step: dict[str, int] = {}
    step, t0 = 0, time.perf_counter()
    cursor = dict.fromkeys(rids, 0)
    while any(cursor[rid] < len(plans[rid]) for rid in rids):
        # request i arrives at step i and then sends one chunk per step, as a talker would
        batch = [rid for i, rid in enumerate(rids) if i <= step and cursor[rid] < len(plans[rid])]
        out, errs = serve(stage, [plans[rid][cursor[rid]] for rid in batch])
        for rid, a, e in zip(batch, out, errs, strict=True):
            cursor[rid] += 1
            if e is not None:
                errors[rid] = e
            elif a.numel():
                audio[rid].append(a)
                first_audio_step.setdefault(rid, step)
        peak_counted = max(peak_counted, engine.live_bytes())
        max_live = max(max_live, len(stage.streams))
        now_rss = rss_bytes()
        if now_rss > peak_rss:
            peak_rss = now_rss
            kept_at_peak = sum(a.numel() * a.element_size() for parts in audio.values() for a in parts)
        step += 1
    wall = time.perf_counter() - t0

    worst = 0.0
    for rid in rids:  # the same request alone, on a stage without a budget
        parts = []
        for payload in plans[rid]:
            out, errs = serve(alone, [payload])
            if errs != [None]:
                raise RuntimeError(f"{rid} alone: {errs}")
            parts.append(out[0])
        solo = torch.cat(parts)
        got = torch.cat(audio[rid]) if audio[rid] else torch.empty(0)
        if got.shape != solo.shape:
            worst = float("inf")
        else:
            worst = max(worst, float((got - solo).abs().max()))
    full_frame = 10 * REAL_FLOW_CONFIG.depth * 2 * 2 * REAL_FLOW_CONFIG.heads * REAL_FLOW_CONFIG.dim_head
    frames = (int(voice.prompt.tokens.shape[-1]) + round(reserve_s * TOKENS_PER_SECOND)) * 2
    return {
        "kv_dtype": kv,
        "streams": args.streams,
        "seconds": args.seconds,
        "reserve_seconds": reserve_s,
        "per_stream_reservation_bytes": per_stream,
        "budget_bytes": budget,
        "budget_waits": engine.budget_waits,
        "budget_refusals": engine.budget_refusals,
        "errors": errors,
        "max_live_streams": max_live,
        "peak_counted_bytes": peak_counted,
        "rss_before_bytes": base_rss,
        "peak_rss_bytes": peak_rss,
        "peak_rss_over_before_bytes": peak_rss - base_rss,
        "audio_kept_at_peak_bytes": kept_at_peak,
        "completed": sum(1 for rid in rids if audio[rid] and rid not in errors),
        "audio_seconds": {rid: round(sum(int(a.numel()) for a in audio[rid]) / SAMPLE_RATE, 3) for rid in rids},
        "first_audio_step": first_audio_step,
        "steps": step,
        "wall_s": round(wall, 2),
        "max_abs_vs_alone": worst,
        "full_size_reservation_bytes": frames * full_frame * (2 if kv == "bfloat16" else 4),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="t2w-budget-") as tmp:
        root = Path(tmp)
        kvs = [kv for kv in KV_DTYPES if kv in args.kv_dtypes.split(",")]
        families = [family_bytes(f, kv, args, root) for f in FAMILIES if f in args.families.split(",") for kv in kvs]
        served = [budget_run(args, kv, root) for kv in args.budget_kv_dtypes.split(",")]
    return {"families": families, "budget": served}


def render(result: dict[str, Any]) -> str:
    lines = [f"$ {result['command']}", ""]
    lines.append(
        f"1. Bytes one stream holds, {result['family_seconds']:.0f} s reply, reduced stand-ins (n_timesteps "
        f"{result['n_timesteps']}), measured after its last non-final chunk; counted: what the budget counts it at"
    )
    lines.append(
        f"{'family':<14}{'K/V':<10}{'audio s':>8}{'own MB':>10}{'peak MB':>10}{'counted MB':>12}"
        f"{'B / audio s':>14}{'full size MB / audio s':>24}"
    )
    for row in result["families"]:
        full = row.get("full_size_bytes_per_audio_second")
        growth = {"minicpmo_4_5": "bounded", "step_audio2": "grows (conformer)"}.get(row["family"], "")
        lines.append(
            f"{row['family']:<14}{row['kv_dtype']:<10}{row['audio_seconds']:>8.1f}{row['own_bytes'] / MB:>10.3f}"
            f"{row['peak_own_bytes'] / MB:>10.3f}{row['counted_bytes'] / MB:>12.3f}{row['bytes_per_audio_second']:>14,}"
            f"{growth if full is None else f'{full / MB:.0f}':>24}"
        )
    lines.append("")
    for run in result["budget"]:
        lines.append(
            f"2. {run['streams']} CosyVoice3 replies of {run['seconds']:.0f} s (K/V {run['kv_dtype']}), one step "
            f"apart, token2wav_memory_budget={run['budget_bytes']:,} B ({run['per_stream_reservation_bytes']:,} B "
            f"reserved per reply, token2wav_stream_reserve_s={run['reserve_seconds']:.0f})"
        )
        lines.append(
            f"   completed {run['completed']}/{run['streams']}, errors {len(run['errors'])}, waits "
            f"{run['budget_waits']}, refusals {run['budget_refusals']}, at most {run['max_live_streams']} live"
        )
        lines.append(
            f"   peak counted {run['peak_counted_bytes']:,} B <= budget; RSS {run['rss_before_bytes'] / MB:.0f} MB "
            f"after one reply alone, peak {run['peak_rss_bytes'] / MB:.0f} MB "
            f"(+{run['peak_rss_over_before_bytes'] / MB:.1f} MB, of which "
            f"{run['audio_kept_at_peak_bytes'] / MB:.1f} MB the benchmark's own copy of the replies' audio)"
        )
        lines.append(
            f"   max |audio - alone| {run['max_abs_vs_alone']:.1e}; {run['steps']} steps in {run['wall_s']:.1f} s; "
            f"first audio at step {run['first_audio_step']}"
        )
        lines.append(
            f"   at full size one reply's reservation would be {run['full_size_reservation_bytes'] / 1e9:.1f} GB"
        )
    return "\n".join(lines) + "\n"


def execute(args: argparse.Namespace) -> int:
    """The run `python -m benchmarks.token2wav_memory_budget` starts (its options: `cli.py` beside this module)."""
    if not 0 < args.fit < args.streams:
        raise SystemExit(f"--fit must be between 1 and --streams - 1 (so some replies wait), got {args.fit}")
    env = run_environment(torch.device("cpu"), args.threads)
    with torch_threads(args.threads), torch.inference_mode():
        result = run(args)
    env["loadavg_end"] = load_average()
    result = {
        "schema": "vllm-omni/token2wav-memory-budget/1",
        "command": invoked_command(),
        "kind": "stand-in (reduced size)",
        "family_seconds": args.family_seconds,
        "n_timesteps": args.n_timesteps,
        "environment": env,
        **result,
    }
    text = render(result)
    publish_json_and_text(result, text, args.json)
    ok = all(r["completed"] == r["streams"] and r["budget_waits"] > 0 for r in result["budget"])
    return 0 if ok else 1
