# SPDX-License-Identifier: Apache-2.0
"""The CosyVoice3 sections of the device check: its stand-in folder, then its code2wav stage on the device.

CosyVoice3's stage (DiT flow with a per-stream K/V arena, causal HiFT) differs from the CosyVoice2-flow
families the `token2wav` section measures in what a user of an accelerator asks: does graph replay stay
exact, what does reduced precision cost in accuracy, does a chunk late in a long reply cost more than an
early one (its attention reads every earlier frame), how many bytes a stream holds per audio second, and
how the stage scales when many streams share a step.

- `cosyvoice3_assets`: the stand-in CosyVoice3 folder (full size on an accelerator: flow 1.33 GB, causal
  HiFT, speech tokenizer; reduced with `--smoke`), timed, so the next section finds it ready.
- `cosyvoice3`: two stages over that folder, one in float32 and one in reduced precision
  (`PRECISIONS`), driven exactly as vLLM-Omni's runner drives them: the talker's growing-prefix chunks
  (`standin/chunk_producer.py`, hops 25 + pad, 50, 100, ...), one `forward` per scheduler step, the
  stage's default voice.
  1. accuracy: one reply through the float32 stage with graphs off (the reference), with graphs on
     (exact replay expected: max abs), and through the reduced-precision stage (max abs, rel L2, per
     chunk and whole);
  2. per-chunk cost: one long reply, the wall time of chunk 1 / 10 / 20 (`--smoke`: 1 / 2 / 3) and of its
     last chunk (upstream's full-attention final call), with the K/V bytes the stream holds per audio
     second after each, for both precisions;
  3. concurrency 1 / 8 / 32 (`--smoke`: 1 / 2): `c` replies of 4 s, every token ready at arrival (an
     infinitely fast talker, so the figures are the stage's own), stepped together; throughput in audio
     seconds per second, time to first audio, step time, graph captures / replays per row.

Sizing on one H100 (full-size stand-in, 10 Euler steps, CFG 2 rows): the DiT is 0.33 G parameters, i.e.
~0.66 GFLOP per frame and pass, ~13 GFLOP per mel frame per chunk (x 2 rows x 10 steps), so a 100-token
chunk (200 frames) is ~2.7 TFLOP and the final full-attention re-run of the 79 s long reply ~52 TFLOP: well
under a second each at H100 rates. The section's 65 s budget is spent mostly on the 32-stream levels, which
stop cooperatively at the budget (status `partial`, the rows measured so far kept).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from vllm_omni_token2wav.benchmarks.device_check.stage import resampler
from vllm_omni_token2wav.platforms.device_graphs import FROM_PLATFORM

if TYPE_CHECKING:
    import torch

    from vllm_omni_token2wav.benchmarks.device_check.sections import SectionContext


@dataclass(frozen=True)
class Cv3Sizes:
    """What the cosyvoice3 section runs (see the module docstring)."""

    levels: tuple[int, ...]  # concurrency levels, in order
    reply_tokens: int  # speech tokens per reply at the concurrency levels and in the accuracy check
    chunk_indices: tuple[int, ...]  # 1-based chunks of the long reply whose cost is reported
    n_timesteps: int
    reserve_s: float  # budget kept for the per-chunk part when the concurrency levels run long


SIZES: Final = Cv3Sizes((1, 8, 32), 100, (1, 10, 20), 10, 10.0)
SMOKE_SIZES: Final = Cv3Sizes((1, 2), 40, (1, 2, 3), 2, 2.0)
#: Stage options per precision arm (`flow_dtype`, the keyword form of `token2wav_dtype`). Float32 is explicit
#: (`auto` follows the platform); "reduced" is what `auto` picks on CUDA and NPU (`token2wav_stage/precision.py`).
PRECISIONS: Final[dict[str, dict[str, Any]]] = {
    "float32": {"flow_dtype": "float32"},
    "reduced": {"flow_dtype": "float16"},
}
#: The producer's hops (`chunk_producer.py`): first 25 + pad, then doubling up to this many tokens.
CHUNK_TOKENS: Final = 25
MAX_HOP_TOKENS: Final = 100
LOOKAHEAD_TOKENS: Final = 3
TOKEN_RATE: Final = 25.0  # speech tokens per audio second
SAMPLE_RATE: Final = 24000


# ---------------------------------------------------------------------------------------------
# cosyvoice3_assets
# ---------------------------------------------------------------------------------------------


def run_cosyvoice3_assets(ctx: SectionContext) -> None:
    from vllm_omni_token2wav.model_executor.models.standin.cosyvoice3_dir import ensure_standin_cosyvoice3_dir

    reduced = ctx.smoke
    ctx.log(f"stand-in CosyVoice3 folder ({'reduced' if reduced else 'full'} size; the first full-size use writes it)")
    with resampler() as which:  # the default voice is the speech clip resampled to 24 kHz
        ctx.result["resampler"] = which
        start = time.perf_counter()
        path = ensure_standin_cosyvoice3_dir(reduced=reduced, seed=ctx.config.seed)
    ctx.result["seconds"] = time.perf_counter() - start
    ctx.result["kind"] = f"stand-in ({'reduced' if reduced else 'full'} size)"
    ctx.result["path"] = str(path)
    ctx.result["bytes"] = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    ctx.shared["cosyvoice3_dir"] = path


def render_cosyvoice3_assets(result: dict[str, Any]) -> list[str]:
    return [
        f"{result.get('kind')} at {result.get('path')}: {result.get('bytes', 0) / 1e9:.2f} GB, "
        f"ready in {result.get('seconds', 0.0):.1f} s"
    ]


# ---------------------------------------------------------------------------------------------
# cosyvoice3: helpers
# ---------------------------------------------------------------------------------------------


def tokens_for_chunks(chunks: int) -> int:
    """Speech tokens a reply needs so that the producer sends at least `chunks` non-final chunks (prompt pad 0)."""
    total, hop = 0, CHUNK_TOKENS
    for _ in range(chunks):
        total += hop
        hop = min(MAX_HOP_TOKENS, hop * 2)
    return total + LOOKAHEAD_TOKENS + 1


def _reply_tokens(count: int, seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(6561) for _ in range(count)]


def _chunks(stage: Any, request_id: str, tokens: Sequence[int]) -> list[Any]:
    from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import ProducerStream, all_chunks

    prompt_tokens = int(stage.default_voice.tokens.shape[1])
    return all_chunks(ProducerStream(request_id, list(tokens), stage.family, prompt_tokens=prompt_tokens))


def _step(stage: Any, payloads: Sequence[Any]) -> list[torch.Tensor]:
    """One scheduler step holding `payloads`; the audio of each (an error in any segment is raised)."""
    from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import forward_inputs
    from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import segment_errors

    input_ids, kwargs = forward_inputs(payloads, stage.family)
    out = stage(input_ids.to(stage.backend.device), None, **kwargs).multimodal_outputs
    errors = segment_errors(out)
    bad = [f"{p.request_id}: {e}" for p, e in zip(payloads, errors, strict=True) if e is not None]
    if bad:
        raise RuntimeError("CosyVoice3 stage step failed: " + "; ".join(bad))
    return [audio.detach().float().cpu().reshape(-1) for audio in out[stage.family.output_key]]


def _graphs(stage: Any) -> dict[str, Any] | None:
    graphs = getattr(stage.backend, "graphs", None)
    return None if graphs is None else graphs.summary()


def _counter_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    if before is None or after is None:
        return {"captures": 0, "replays": 0, "eager_fallbacks": 0, "graph_runtime": None}
    return {
        "captures": after.get("captures", 0) - before.get("captures", 0),
        "replays": after.get("replays", 0) - before.get("replays", 0),
        "eager_fallbacks": after.get("eager_fallbacks", 0) - before.get("eager_fallbacks", 0),
        "graph_runtime": after.get("backend"),
    }


def _flow_dtype(stage: Any) -> str | None:
    flow = getattr(stage.token2wav, "flow", None)
    param = next(iter(flow.parameters()), None) if flow is not None else None
    return None if param is None else str(param.dtype).removeprefix("torch.")


def _own_bytes(stage: Any) -> int:
    return sum(b.own for b in stage.executor.stream_bytes())


def compare(audio: torch.Tensor, reference: torch.Tensor) -> dict[str, float | None]:
    """`audio` against `reference` over their common length: waveform max abs and relative L2, and the same
    for their 24 kHz log mel (phase-blind: a vocoder's sine source turns a tiny F0 change into a phase
    drift that decorrelates waveforms while the spectrum stays put), plus the length gap."""

    from vllm_omni_token2wav.model_executor.models.audio.mel import PROMPT_MEL_CONFIG, prompt_mel_24k

    n = min(audio.numel(), reference.numel())
    a, r = audio[:n].float(), reference[:n].float()
    out: dict[str, float | None] = {**_diff(a, r), "length_gap": int(abs(audio.numel() - reference.numel()))}
    if n > PROMPT_MEL_CONFIG.pad + PROMPT_MEL_CONFIG.hop_length:
        mel = _diff(prompt_mel_24k(a), prompt_mel_24k(r))
        out |= {"log_mel_max_abs": mel["max_abs"], "log_mel_rel_l2": mel["rel_l2"]}
    else:
        out |= {"log_mel_max_abs": None, "log_mel_rel_l2": None}
    return out


def _diff(a: torch.Tensor, r: torch.Tensor) -> dict[str, float]:
    import torch

    diff = a.double() - r.double()
    ref_norm = float(torch.linalg.vector_norm(r.double()))
    return {
        "max_abs": float(diff.abs().max()) if diff.numel() else 0.0,
        "rel_l2": float(torch.linalg.vector_norm(diff)) / ref_norm if ref_norm > 0 else 0.0,
    }


def _serve_alone(stage: Any, request_id: str, tokens: Sequence[int], timer: Callable[[], None]) -> list[dict[str, Any]]:
    """One reply alone, chunk by chunk: per chunk its audio, wall ms (device synchronised) and the stream's bytes."""
    rows = []
    chunks = _chunks(stage, request_id, tokens)
    emitted = 0
    for index, payload in enumerate(chunks, start=1):
        timer()
        start = time.perf_counter()
        (audio,) = _step(stage, [payload])
        timer()
        ms = (time.perf_counter() - start) * 1e3
        emitted += audio.numel()
        own = _own_bytes(stage) if not payload.last else None
        rows.append(
            {
                "chunk": index,
                "last": payload.last,
                "tokens_sent": len(payload.tokens),
                "ms": ms,
                "audio": audio,
                "audio_s_total": emitted / SAMPLE_RATE,
                "stream_bytes": own,
            }
        )
    stage.on_requests_finished([request_id])
    return rows


# ---------------------------------------------------------------------------------------------
# cosyvoice3: the section
# ---------------------------------------------------------------------------------------------


def _build(ctx: SectionContext, folder: Path, precision: str, max_rows: int, n_timesteps: int) -> Any:
    from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_code2wav import CosyVoice3Code2Wav

    extra = {} if ctx.graph_api is FROM_PLATFORM else {"device_graph_api": ctx.graph_api}
    stage = CosyVoice3Code2Wav(
        model=str(folder),
        device=ctx.device,
        n_timesteps=n_timesteps,
        max_rows=max_rows,
        seed=ctx.config.seed,
        **PRECISIONS[precision],
        **extra,
    )
    stage.load_weights([])
    return stage


def run_cosyvoice3(ctx: SectionContext) -> None:
    with resampler() as which:  # the stage resamples its default voice and the prompt audio
        ctx.result["resampler"] = which
        _run_cosyvoice3(ctx)


def _run_cosyvoice3(ctx: SectionContext) -> None:
    sizes = SMOKE_SIZES if ctx.smoke else SIZES
    folder = ctx.shared.get("cosyvoice3_dir")
    if folder is None:
        from vllm_omni_token2wav.model_executor.models.standin.cosyvoice3_dir import ensure_standin_cosyvoice3_dir

        folder = ensure_standin_cosyvoice3_dir(reduced=ctx.smoke, seed=ctx.config.seed)
    ctx.result["config"] = {
        "levels": list(sizes.levels),
        "reply_tokens": sizes.reply_tokens,
        "chunk_indices": list(sizes.chunk_indices),
        "n_timesteps": sizes.n_timesteps,
        "precisions": {name: dict(options) for name, options in PRECISIONS.items()},
    }
    start = time.perf_counter()
    stages = {name: _build(ctx, folder, name, max(sizes.levels), sizes.n_timesteps) for name in PRECISIONS}
    ctx.result["setup_s"] = time.perf_counter() - start
    ctx.result["flow_dtype"] = {name: _flow_dtype(stage) for name, stage in stages.items()}
    ctx.result["graphs_available"] = {name: stage.set_device_graphs(True) for name, stage in stages.items()}
    ctx.flush()
    _accuracy(ctx, stages, sizes)
    _per_chunk(ctx, stages, sizes)
    _concurrency(ctx, stages, sizes)
    ctx.result["stage_graphs"] = {name: _graphs(stage) for name, stage in stages.items()}
    if ctx.device.type != "cpu":
        ctx.result["memory"] = ctx.platform.memory_stats(ctx.device)


def _accuracy(ctx: SectionContext, stages: dict[str, Any], sizes: Cv3Sizes) -> None:
    """float32 eager is the reference; graphs on (float32) and reduced precision (graphs off) against it."""
    import torch

    tokens = _reply_tokens(sizes.reply_tokens, ctx.config.seed)
    runs: dict[str, list[dict[str, Any]]] = {}
    counters: dict[str, Any] = {}
    for label, precision, graphs in (
        ("float32 eager", "float32", False),
        ("float32 graphs", "float32", True),
        ("reduced eager", "reduced", False),
    ):
        stage = stages[precision]
        stage.set_device_graphs(graphs)
        before = _graphs(stage)
        # one request id for every arm: the stage derives the request's noise from it
        runs[label] = _serve_alone(stage, "accuracy", tokens, ctx.sync)
        counters[label] = _counter_delta(before, _graphs(stage))
    reference = runs["float32 eager"]
    whole_ref = torch.cat([r["audio"] for r in reference])
    rows = []
    for label in ("float32 graphs", "reduced eager"):
        chunks = runs[label]
        per_chunk = [compare(c["audio"], r["audio"]) for c, r in zip(chunks, reference, strict=False)]
        rows.append(
            {
                "arm": label,
                "vs": "float32 eager",
                "chunks": len(chunks),
                "whole": compare(torch.cat([c["audio"] for c in chunks]), whole_ref),
                "worst_chunk_max_abs": max((p["max_abs"] or 0.0 for p in per_chunk), default=0.0),
                "worst_chunk_rel_l2": max((p["rel_l2"] or 0.0 for p in per_chunk), default=0.0),
                "graph_counters": counters[label],
            }
        )
    ctx.result["accuracy"] = {"reply_tokens": sizes.reply_tokens, "peak": float(whole_ref.abs().max()), "rows": rows}
    ctx.flush()


def _per_chunk(ctx: SectionContext, stages: dict[str, Any], sizes: Cv3Sizes) -> None:
    """One long reply per precision (graphs on where available): the cost of chunks 1 / 10 / 20 and the last."""
    tokens = _reply_tokens(tokens_for_chunks(max(sizes.chunk_indices)), ctx.config.seed + 1)
    out: dict[str, Any] = {"reply_tokens": len(tokens), "reply_s": len(tokens) / TOKEN_RATE, "rows": []}
    ctx.result["per_chunk"] = out
    for precision, stage in stages.items():
        if ctx.time_left() < sizes.reserve_s:
            ctx.note(f"per-chunk cost: out of budget before {precision}")
            ctx.partial = True
            break
        stage.set_device_graphs(True)
        chunks = _serve_alone(stage, f"long-{precision}", tokens, ctx.sync)
        wanted = {i for i in sizes.chunk_indices if i < len(chunks)}
        first = chunks[0]
        for row in chunks:
            if row["chunk"] in wanted or row["last"]:
                held, audio_s = row["stream_bytes"], row["audio_s_total"]
                grown_s = audio_s - first["audio_s_total"]
                out["rows"].append(
                    {
                        "precision": precision,
                        "chunk": row["chunk"],
                        "last": row["last"],
                        "ms": row["ms"],
                        "history_s": audio_s,
                        "stream_bytes": held,
                        # what the stream's own caches grew by per audio second since its first chunk (the K/V
                        # arena dominates; the first chunk also holds fixed parts: conv history, prompt frames)
                        "kv_bytes_per_audio_s": (held - first["stream_bytes"]) / grown_s
                        if held is not None and grown_s > 0
                        else None,
                    }
                )
        ctx.flush()


def _concurrency(ctx: SectionContext, stages: dict[str, Any], sizes: Cv3Sizes) -> None:
    rows: list[dict[str, Any]] = ctx.result.setdefault("rows", [])
    arms = (("reduced", True), ("reduced", False), ("float32", True))
    for c in sizes.levels:
        for precision, graphs in arms:
            if ctx.out_of_time(reserve_s=1.0):
                ctx.note(f"concurrency: out of budget before c={c} {precision} graphs {'on' if graphs else 'off'}")
                return
            rows.append(_level(ctx, stages[precision], precision, graphs, c, sizes))
            ctx.flush()


def _level(ctx: SectionContext, stage: Any, precision: str, graphs: bool, c: int, sizes: Cv3Sizes) -> dict[str, Any]:
    """`c` replies stepped together, every chunk ready at arrival: one row of the concurrency table."""
    stage.set_device_graphs(graphs)
    before = _graphs(stage)
    pending = {
        f"c{c}-{precision}-g{int(graphs)}-{i}": _chunks(
            stage, f"c{c}-{precision}-g{int(graphs)}-{i}", _reply_tokens(sizes.reply_tokens, 100 + i)
        )
        for i in range(c)
    }
    first_audio: dict[str, float] = {}
    samples, steps, step_s = 0, 0, []
    stopped = False
    ctx.sync()
    start = time.perf_counter()
    while pending:
        if ctx.out_of_time(reserve_s=0.5):
            stopped = True
            break
        payloads = [chunks.pop(0) for chunks in pending.values()]
        t0 = time.perf_counter()
        audio = _step(stage, payloads)
        ctx.sync()
        now = time.perf_counter()
        step_s.append(now - t0)
        steps += 1
        for payload, wav in zip(payloads, audio, strict=True):
            samples += wav.numel()
            if wav.numel() and payload.request_id not in first_audio:
                first_audio[payload.request_id] = now - start
        pending = {rid: chunks for rid, chunks in pending.items() if chunks}
    wall = time.perf_counter() - start
    stage.on_requests_finished([f"c{c}-{precision}-g{int(graphs)}-{i}" for i in range(c)])
    ttfp = sorted(first_audio.values())
    step_s.sort()
    return {
        "concurrency": c,
        "precision": precision,
        "graphs": graphs,
        "stopped": stopped,
        "steps": steps,
        "audio_s": samples / SAMPLE_RATE,
        "wall_s": wall,
        "throughput_audio_s_per_s": samples / SAMPLE_RATE / wall if wall > 0 else None,
        "ttfp_p50_s": ttfp[len(ttfp) // 2] if ttfp else None,
        "ttfp_max_s": ttfp[-1] if ttfp else None,
        "step_p50_s": step_s[len(step_s) // 2] if step_s else None,
        **_counter_delta(before, _graphs(stage)),
    }


def render_cosyvoice3(result: dict[str, Any]) -> list[str]:
    def num(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    lines = [
        f"flow dtype {result.get('flow_dtype')}; graphs replay {result.get('graphs_available')}; "
        f"setup {result.get('setup_s', 0.0):.1f} s"
    ]
    accuracy = result.get("accuracy")
    if accuracy:
        lines.append(f"accuracy ({accuracy['reply_tokens']} tokens, peak {accuracy['peak']:.3g}; vs float32 eager):")
        for row in accuracy["rows"]:
            whole, counters = row["whole"], row["graph_counters"]
            lines.append(
                f"  {row['arm']:<15} whole max abs {whole['max_abs']:.3g} rel L2 {whole['rel_l2']:.3g} (log mel "
                f"{num(whole['log_mel_max_abs'], '.3g')} / {num(whole['log_mel_rel_l2'], '.3g')}); worst chunk "
                f"max abs {row['worst_chunk_max_abs']:.3g} rel L2 {row['worst_chunk_rel_l2']:.3g}; "
                f"captures {counters['captures']} replays {counters['replays']}"
            )
    per_chunk = result.get("per_chunk")
    if per_chunk and per_chunk.get("rows"):
        lines.append(f"per chunk (one {per_chunk['reply_s']:.0f} s reply):")
        for row in per_chunk["rows"]:
            name = "last" if row["last"] else f"chunk {row['chunk']}"
            lines.append(
                f"  {row['precision']:<8} {name:<9} {row['ms']:9.1f} ms at {row['history_s']:6.1f} s of audio; "
                f"stream {num(row['stream_bytes'] and row['stream_bytes'] / 1e6, '.2f')} MB, grown "
                f"{num(row['kv_bytes_per_audio_s'] and row['kv_bytes_per_audio_s'] / 1e6, '.3f')} MB per audio s"
            )
    if result.get("rows"):
        lines.append(
            f"{'c':>3} {'precision':>9} {'graphs':>6} {'audio/s':>8} {'TTFP p50':>9} {'step p50':>9} "
            f"{'capt':>5} {'repl':>6}"
        )
        for r in result["rows"]:
            lines.append(
                f"{r['concurrency']:>3} {r['precision']:>9} {'on' if r['graphs'] else 'off':>6} "
                f"{num(r['throughput_audio_s_per_s'], '8.2f')} {num(r['ttfp_p50_s'], '8.3f')}s "
                f"{num(r['step_p50_s'], '8.3f')}s {r['captures']:>5} {r['replays']:>6}"
                + ("  (stopped early)" if r["stopped"] else "")
            )
    return lines


__all__ = [
    "PRECISIONS",
    "SIZES",
    "SMOKE_SIZES",
    "Cv3Sizes",
    "compare",
    "render_cosyvoice3",
    "render_cosyvoice3_assets",
    "run_cosyvoice3",
    "run_cosyvoice3_assets",
    "tokens_for_chunks",
]
