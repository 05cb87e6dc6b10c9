# SPDX-License-Identifier: Apache-2.0
"""Measure the CosyVoice3 flow's cross-request launch: B streams' chunks in one `stream_chunks` call vs B calls.

Why: the stage runs the chunks of every request of a step in one flow launch (per-frame ops ragged
across rows, attention per row, `layers/flow_cosyvoice3/batched.py`). CI pins the result (each row equals the row run
alone); this measures what the launch saves and how far the rows move, for docs/design/cosyvoice3.md
("Cross-request batching"). Per chunk index the solo calls and the batched call alternate in order
(A/B interleaved), on streams with different prompts and noise seeds, 25-token hops after upstream's
first hop. Process CPU time is the measure on a shared host (wall time is recorded too).

The numbers recorded in `benchmarks/results/cosyvoice3_batched_flow_cpu*.json` were measured by this
code when it was a script in `tools/` (same steps, same JSON layout).

`whole=True` measures whole utterances instead (the stage's sync path): B utterances of different lengths,
prompts and noise seeds through `whole_rows.inference_rows` (one launch) vs B `flow.inference` calls, A/B
interleaved per repeat (`benchmarks/results/cosyvoice3_batched_flow_whole_cpu.json`). The causal HiFT runs per
row on both sides of the stage, so only the flow is timed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

_T = TypeVar("_T")


@dataclass(frozen=True)
class BatchedFlowConfig:
    """What one run measures: `rows` stream counts, `chunks` timed chunks each (after upstream's first hop)."""

    full: bool = False
    rows: tuple[int, ...] = (1, 2, 4, 8)
    chunks: int = 6
    hop: int = 25
    n_timesteps: int = 10
    threads: int = 1
    #: whole utterances (`chunks` repeats of `hop` + 13 i tokens for row i) instead of stream chunks
    whole: bool = False


def _timed(fn: Callable[..., _T], *args: Any) -> tuple[_T, float, float]:
    """(result, process CPU seconds, wall seconds) of `fn(*args)`."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.process_time() - cpu, time.perf_counter() - wall


def measure(flow: Any, rows: int, chunks: int, hop: int, n_timesteps: int) -> dict[str, Any]:
    """One stream count: per chunk index, B solo `stream_chunk` calls vs one `stream_chunks` launch."""
    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import (
        start_stream,
        stream_chunk,
        stream_chunks,
        upstream_hops,
    )

    def one_by_one(work: Sequence[tuple[Any, torch.Tensor, bool]]) -> list[Any]:
        return [stream_chunk(flow, state, tokens, final=final) for state, tokens, final in work]

    streams: list[dict[str, Any]] = []
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
        solo, s_cpu, s_wall = _timed(one_by_one, work)
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
    return _row_summary(rows, "chunks", out)


def _row_summary(rows: int, key: str, out: list[dict[str, Any]]) -> dict[str, Any]:
    """One row count's result: its measurements under `key`, their medians without the first (the first chunk, or
    the warm-up repeat) and the largest launch-vs-solo difference."""
    steady = out[1:] or out
    return {
        "rows": rows,
        key: out,
        "median_solo_cpu_s": statistics.median(r["solo_cpu_s"] for r in steady),
        "median_batched_cpu_s": statistics.median(r["batched_cpu_s"] for r in steady),
        "max_abs_diff": max(r["max_abs_diff"] for r in out),
    }


def measure_whole(flow: Any, rows: int, repeats: int, tokens: int, n_timesteps: int) -> dict[str, Any]:
    """One row count: per repeat, B solo `flow.inference` calls (whole utterances) vs one `inference_rows` launch."""
    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.whole_rows import WholeRow, inference_rows

    utterances = []
    for i in range(rows):
        g = torch.Generator().manual_seed(i)
        prompt_tokens = torch.randint(0, 6561, (1, 50 + 7 * i), generator=g)
        prompt_mel = torch.randn(1, 2 * prompt_tokens.shape[1], 80, generator=g) * 0.5 - 4.0
        spk = torch.randn(1, 192, generator=g)
        ids = torch.randint(0, 6561, (1, tokens + 13 * i), generator=g)
        utterances.append(WholeRow(ids, prompt_tokens, prompt_mel, spk, i))

    def one_by_one() -> list[torch.Tensor]:
        return [
            flow.inference(
                u.tokens,
                u.tokens.shape[1],
                u.prompt_tokens,
                u.prompt_tokens.shape[1],
                u.prompt_mel,
                u.prompt_mel.shape[1],
                u.embedding,
                n_timesteps=n_timesteps,
                noise_seed=u.noise_seed,
            )
            for u in utterances
        ]

    def one_launch() -> list[torch.Tensor]:
        return inference_rows(flow, utterances, n_timesteps=n_timesteps)

    out = []
    for k in range(repeats):
        solo_first = k % 2 == 0
        if not solo_first:
            batched, b_cpu, b_wall = _timed(one_launch)
        solo, s_cpu, s_wall = _timed(one_by_one)
        if solo_first:
            batched, b_cpu, b_wall = _timed(one_launch)
        diff = max(float((a - b).abs().max()) for a, b in zip(solo, batched, strict=True))
        out.append(
            {
                "repeat": k + 1,
                "solo_cpu_s": s_cpu,
                "batched_cpu_s": b_cpu,
                "solo_wall_s": s_wall,
                "batched_wall_s": b_wall,
                "max_abs_diff": diff,
                "frames": int(sum(m.shape[-1] for m in batched)),
            }
        )
    return _row_summary(rows, "repeats", out)


def run(config: BatchedFlowConfig) -> dict[str, Any]:
    """Every stream count of `config` on the seeded stand-in flow (CPU), as the recorded JSON document."""
    from vllm_omni_token2wav.benchmarks.common import torch_threads
    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import ensure_standin_flow, load_flow

    result: dict[str, Any] = {
        "full": config.full,
        "threads": config.threads,
        "n_timesteps": config.n_timesteps,
        "hop": config.hop,
    }
    with torch_threads(config.threads):
        flow = load_flow(ensure_standin_flow(reduced=not config.full, seed=0), device="cpu")
        with torch.inference_mode():
            if config.whole:
                result["whole"] = True
                result["runs"] = [
                    measure_whole(flow, b, config.chunks, config.hop, config.n_timesteps) for b in config.rows
                ]
            else:
                result["runs"] = [measure(flow, b, config.chunks, config.hop, config.n_timesteps) for b in config.rows]
    return result


def render_lines(result: dict[str, Any]) -> list[str]:
    """One line per stream count: median CPU ms of the B solo calls and of the one launch, their ratio."""
    lines = []
    kind = "whole " if result.get("whole") else ""
    for run_ in result["runs"]:
        solo, batched = run_["median_solo_cpu_s"], run_["median_batched_cpu_s"]
        lines.append(
            f"{kind}rows {run_['rows']:2d}: solo {solo * 1e3:8.1f} ms CPU, one launch {batched * 1e3:8.1f} ms CPU, "
            f"ratio {solo / batched:5.2f}, max |diff| {run_['max_abs_diff']:.1e}"
        )
    return lines
