# SPDX-License-Identifier: Apache-2.0
"""Cost per chunk vs chunk index of CosyVoice3's streaming flow: cached stream vs upstream's prefix re-run.

Upstream streams the flow by re-running it over prompt + every token so far for each chunk, so chunk
k costs O(k); the in-tree stream (`cosyvoice3.flow.streaming`) computes only the new frames from
per-request caches. This benchmark measures both in one process, interleaved chunk by chunk (A then B
at the same chunk index, so host load drifts hit both), on one token sequence:

- ours: `stream_chunk` for every chunk of a stream (each chunk can only be run after the previous);
- baseline: `inference(prefix, streaming=True, finalize=False)`, what upstream runs for that chunk,
  timed at selected chunk indices only (its cost at index k does not depend on earlier runs);
- the two outputs are compared (max |diff|) at those indices: the benchmark also checks equality.

Chunks are a fixed hop (default 25 tokens, the model's 50-frame attention chunk) after a prompt
aligned like upstream's first hop, so every chunk does the same amount of new work and the curve
shows what the history adds.

The stream's last call (`final_tokens` more tokens, `final=True`) is timed both ways from the same
state, in alternating order per repeat: with full attention over the whole utterance (the default,
`FinalChunk.FULL_ATTENTION`: what upstream serves, one whole-utterance re-run) and block-causal from the
caches (`FinalChunk.BLOCK_CAUSAL`, opt-in). `FinalChunkCost` keeps both, what the full-attention call
adds per utterance, that as a share of the utterance's streamed flow time, and how far the two last
chunks' mel lie apart. The stage benchmark (`vllm-omni-token2wav bench token2wav --family cosyvoice3`,
later) reuses `measure_chunk_costs`. Rendering lives in `report.py` beside it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from vllm_omni_token2wav.benchmarks.common import (
    resolve_device,
    run_environment,
    stamp_load_at_end,
    synced_seconds,
    torch_threads,
)
from vllm_omni_token2wav.benchmarks.progress import progress

DEFAULT_BASELINE_AT: tuple[int, ...] = (1, 2, 5, 10, 20, 30, 40, 50)
_T = TypeVar("_T")


class BenchSetupError(ValueError):
    """An input of the run cannot be used (the message says which)."""


@dataclass(frozen=True)
class BenchConfig:
    model_dir: Path | None = None
    full: bool = False
    device: str = "auto"
    threads: int = 1
    prompt_tokens: int = 75
    hop_tokens: int = 25
    chunks: int = 50
    n_timesteps: int = 10
    repeats: int = 3
    baseline_at: tuple[int, ...] = DEFAULT_BASELINE_AT
    seed: int = 0
    #: tokens of the stream's last call (`final=True`), timed with full attention and block-causal
    final_tokens: int = 25

    def validate(self) -> None:
        problems = []
        for name, low in (
            ("prompt_tokens", 0),
            ("hop_tokens", 1),
            ("chunks", 1),
            ("n_timesteps", 1),
            ("repeats", 1),
            ("final_tokens", 0),
        ):
            if getattr(self, name) < low:
                problems.append(f"{name.replace('_', '-')} must be >= {low}, got {getattr(self, name)}")
        bad = [k for k in self.baseline_at if not 1 <= k <= self.chunks]
        if bad:
            problems.append(f"baseline-at {bad}: chunk indices run from 1 to --chunks {self.chunks}")
        if problems:
            raise BenchSetupError("; ".join(problems))

    @property
    def first_hop(self) -> int:
        """Upstream's first hop rule: pad the prompt to a 25-token boundary, then one hop."""
        return self.hop_tokens + (-self.prompt_tokens) % 25

    @property
    def gen_tokens(self) -> int:
        """Generated tokens fed: all chunks plus the 3 lookahead tokens of the last one."""
        return self.first_hop + (self.chunks - 1) * self.hop_tokens + 3


@dataclass
class ChunkCost:
    index: int
    #: mel frames emitted by this chunk and frames before it (prompt included): the history it attends to
    frames: int
    history_frames: int
    ours_ms: list[float] = field(default_factory=list)
    baseline_ms: list[float] = field(default_factory=list)
    #: process CPU time of the same calls: the work done, robust to other processes on a busy host
    ours_cpu_ms: list[float] = field(default_factory=list)
    baseline_cpu_ms: list[float] = field(default_factory=list)
    max_abs_diff: float | None = None
    cache_mb: float | None = None

    @property
    def ours_median_ms(self) -> float:
        return statistics.median(self.ours_ms) if self.ours_ms else float("nan")

    @property
    def baseline_median_ms(self) -> float:
        return statistics.median(self.baseline_ms) if self.baseline_ms else float("nan")

    @property
    def ratio(self) -> float:
        """baseline / ours wall time (how many times cheaper the cached chunk is)."""
        return self.baseline_median_ms / self.ours_median_ms

    @property
    def cpu_ratio(self) -> float:
        """baseline / ours process CPU time."""
        if not (self.ours_cpu_ms and self.baseline_cpu_ms):
            return float("nan")
        return statistics.median(self.baseline_cpu_ms) / statistics.median(self.ours_cpu_ms)


@dataclass
class FinalChunkCost:
    """The stream's last call (once per utterance), both `FinalChunk` modes from the same state, per repeat."""

    #: new tokens the last call feeds, and the utterance's mel frames (prompt + generated) it ends
    tokens: int = 0
    utterance_frames: int = 0
    generated_seconds: float = 0.0
    full_attention_ms: list[float] = field(default_factory=list)
    full_attention_cpu_ms: list[float] = field(default_factory=list)
    block_causal_ms: list[float] = field(default_factory=list)
    block_causal_cpu_ms: list[float] = field(default_factory=list)
    #: the utterance's other calls (stream set-up + every chunk, ours), per repeat: what the last call adds to
    stream_ms: list[float] = field(default_factory=list)
    stream_cpu_ms: list[float] = field(default_factory=list)
    #: max |full attention - block-causal| over the last call's mel (the size of the difference)
    max_abs_diff: float | None = None

    def summary(self) -> dict[str, Any]:
        if not (self.full_attention_ms and self.block_causal_ms):
            return {}

        def med(values: list[float]) -> float:
            return statistics.median(values) if values else float("nan")

        full, block, stream = med(self.full_attention_ms), med(self.block_causal_ms), med(self.stream_ms)
        full_cpu, block_cpu, stream_cpu = (
            med(self.full_attention_cpu_ms),
            med(self.block_causal_cpu_ms),
            med(self.stream_cpu_ms),
        )
        return {
            "final_tokens": self.tokens,
            "utterance_frames": self.utterance_frames,
            "generated_seconds": self.generated_seconds,
            "full_attention_ms": full,
            "block_causal_ms": block,
            "full_over_block": full / block,
            "adds_ms_per_utterance": full - block,
            "adds_share_of_stream": (full - block) / (stream + block) if stream == stream else None,
            "full_attention_cpu_ms": full_cpu,
            "block_causal_cpu_ms": block_cpu,
            "adds_cpu_ms_per_utterance": full_cpu - block_cpu,
            "adds_cpu_share_of_stream": (full_cpu - block_cpu) / (stream_cpu + block_cpu)
            if stream_cpu == stream_cpu
            else None,
            "stream_ms": stream,
            "stream_cpu_ms": stream_cpu,
            "max_abs_diff": self.max_abs_diff,
        }


@dataclass
class BenchReport:
    config: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    setup_ms: list[float] = field(default_factory=list)
    chunks: list[ChunkCost] = field(default_factory=list)
    final: FinalChunkCost = field(default_factory=FinalChunkCost)

    def chunk(self, index: int) -> ChunkCost | None:
        return next((c for c in self.chunks if c.index == index), None)

    def summary(self) -> dict[str, Any]:
        measured = [c for c in self.chunks if c.ours_ms]
        out: dict[str, Any] = {}
        # the reference chunk is the second: the first also finishes the prompt's incomplete last chunk
        if len(measured) >= 2:
            ref, last = measured[1], measured[-1]
            out["reference_chunk"] = ref.index
            out["ours_reference_ms"] = ref.ours_median_ms
            out["ours_last_ms"] = last.ours_median_ms
            out["ours_last_over_reference"] = last.ours_median_ms / ref.ours_median_ms
            out["ours_cpu_last_over_reference"] = statistics.median(last.ours_cpu_ms) / statistics.median(
                ref.ours_cpu_ms
            )
        for k in (20, 50):
            c = self.chunk(k)
            out[f"ratio_at_{k}"] = c.ratio if c is not None and c.baseline_ms and c.ours_ms else None
            out[f"cpu_ratio_at_{k}"] = c.cpu_ratio if c is not None else None
        diffs = [c.max_abs_diff for c in self.chunks if c.max_abs_diff is not None]
        out["max_abs_diff"] = max(diffs) if diffs else None
        out["final_chunk"] = self.final.summary() or None
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "benchmark": "cosyvoice3_flow_stream",
            "command": self.command,
            "config": self.config,
            "environment": self.environment,
            "weights": self.weights,
            "setup_ms": self.setup_ms,
            "summary": self.summary(),
            "final_chunk": asdict(self.final),
            "chunks": [
                {
                    **asdict(c),
                    "ours_median_ms": c.ours_median_ms,
                    "baseline_median_ms": c.baseline_median_ms,
                    "ratio": c.ratio if c.baseline_ms and c.ours_ms else None,
                    "cpu_ratio": c.cpu_ratio,
                }
                for c in self.chunks
            ],
        }


def cpu_timed(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> tuple[_T, float]:
    """`fn(...)` and the CPU seconds this process spent in it (all threads)."""
    start = time.process_time()
    out = fn(*args, **kwargs)
    return out, time.process_time() - start


def measure_chunk_costs(
    flow: Any,
    prompt: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    tokens: torch.Tensor,
    hops: Sequence[int],
    *,
    n_timesteps: int,
    baseline_at: Sequence[int],
    sync: Callable[[], None],
    report: list[ChunkCost],
    setup_ms: list[float],
    on_chunk: Callable[[], None] = lambda: None,
    on_mel: Callable[[int, torch.Tensor, torch.Tensor | None], None] | None = None,
    final: FinalChunkCost | None = None,
) -> None:
    """One stream over `tokens` with the given hops, each chunk timed; the baseline at `baseline_at` (1-based).

    Appends to `report` (one `ChunkCost` per chunk index, created on the first repeat) and `setup_ms`,
    so an interrupted run keeps what it measured. `on_mel(index, ours, baseline or None)` gets every
    chunk's new mel after the timed calls (the end-to-end benchmark vocodes it). With `final`, the
    tokens after the last hop's lookahead are then fed as the last call, timed in both `FinalChunk`
    modes (`measure_final_chunk`).
    """
    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import start_stream, stream_chunk

    pt, pm, spk = prompt
    (state, seconds), setup_cpu = cpu_timed(
        synced_seconds, sync, start_stream, flow, pt, pm, spk, n_timesteps=n_timesteps
    )
    setup_ms.append(1000.0 * seconds)
    stream_ms, stream_cpu_ms = 1000.0 * seconds, 1000.0 * setup_cpu
    offset = fed = 0
    for index, hop in enumerate(hops, start=1):
        end = offset + hop + 3
        ((mel, state), seconds), cpu = cpu_timed(synced_seconds, sync, stream_chunk, flow, state, tokens[:, fed:end])
        stream_ms, stream_cpu_ms = stream_ms + 1000.0 * seconds, stream_cpu_ms + 1000.0 * cpu
        if len(report) < index:
            report.append(ChunkCost(index, 2 * hop, 2 * (pt.size(1) + offset)))
        cost = report[index - 1]
        cost.ours_ms.append(1000.0 * seconds)
        cost.ours_cpu_ms.append(1000.0 * cpu)
        cost.cache_mb = state.cache_bytes / 2**20
        if index in baseline_at:
            prefix = tokens[:, :end]
            lengths = (prefix.size(1), pt, pt.size(1), pm, pm.size(1), spk)
            (full, seconds), cpu = cpu_timed(
                synced_seconds,
                sync,
                flow.inference,
                prefix,
                *lengths,
                streaming=True,
                finalize=False,
                n_timesteps=n_timesteps,
            )
            cost.baseline_ms.append(1000.0 * seconds)
            cost.baseline_cpu_ms.append(1000.0 * cpu)
            diff = (full[:, :, 2 * offset :] - mel).abs().max().item()
            cost.max_abs_diff = max(diff, cost.max_abs_diff or 0.0)
            if on_mel is not None:
                on_mel(index, mel, full[:, :, 2 * offset :])
        elif on_mel is not None:
            on_mel(index, mel, None)
        fed, offset = end, offset + hop
        on_chunk()
    if final is not None:
        final.stream_ms.append(stream_ms)
        final.stream_cpu_ms.append(stream_cpu_ms)
        measure_final_chunk(
            flow, state, tokens[:, fed:], sync=sync, cost=final, full_first=len(final.stream_ms) % 2 == 1
        )


def measure_final_chunk(
    flow: Any, state: Any, tokens: torch.Tensor, *, sync: Callable[[], None], cost: FinalChunkCost, full_first: bool
) -> None:
    """The last call of the stream at `state` (started in the default `FinalChunk.FULL_ATTENTION` mode), timed
    with full attention (a whole-utterance re-run, `finalize=True, streaming=False`, upstream's last call) and
    block-causal from the caches (the same state with `FinalChunk.BLOCK_CAUSAL`), one after the other in the
    order `full_first` says. States are immutable, so both calls start from the same stream."""
    import dataclasses

    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import FinalChunk, stream_chunk

    if state.final_chunk is not FinalChunk.FULL_ATTENTION or state.replay is None:
        raise BenchSetupError("the last-call comparison needs a stream started in FinalChunk.FULL_ATTENTION mode")
    block_state = dataclasses.replace(state, final_chunk=FinalChunk.BLOCK_CAUSAL, replay=None)
    mels: dict[FinalChunk, torch.Tensor] = {}
    order = (FinalChunk.FULL_ATTENTION, FinalChunk.BLOCK_CAUSAL)
    for mode in order if full_first else order[::-1]:
        start = state if mode is FinalChunk.FULL_ATTENTION else block_state
        ((mel, done), seconds), cpu = cpu_timed(synced_seconds, sync, stream_chunk, flow, start, tokens, final=True)
        mels[mode] = mel
        wall_list, cpu_list = (
            (cost.full_attention_ms, cost.full_attention_cpu_ms)
            if mode is FinalChunk.FULL_ATTENTION
            else (cost.block_causal_ms, cost.block_causal_cpu_ms)
        )
        wall_list.append(1000.0 * seconds)
        cpu_list.append(1000.0 * cpu)
    cost.tokens = int(tokens.size(1))
    cost.utterance_frames = int(done.emitted_frames)
    cost.generated_seconds = done.generated_tokens / 25.0
    full, block = mels[FinalChunk.FULL_ATTENTION], mels[FinalChunk.BLOCK_CAUSAL]
    if full.shape != block.shape:
        raise RuntimeError(f"last call: full attention emitted {full.shape[-1]} frames, block-causal {block.shape[-1]}")
    diff = (full - block).abs().max().item() if full.numel() else 0.0
    cost.max_abs_diff = max(diff, cost.max_abs_diff or 0.0)


class FlowStreamBenchmark:
    def __init__(self, config: BenchConfig, stage: Callable[[str], None] | None = None) -> None:
        config.validate()
        self.config = config
        self.stage = stage or (lambda _text: None)
        self.report = BenchReport(config={**asdict(config), "model_dir": str(config.model_dir or "")})
        self.report.config.update(first_hop=config.first_hop, gen_tokens=config.gen_tokens)

    def run(self) -> BenchReport:
        with torch_threads(self.config.threads), stamp_load_at_end(lambda: self.report.environment):
            self._run()
        return self.report

    def _load(self, device: torch.device) -> Any:
        from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import ensure_standin_flow, load_flow

        cfg = self.config
        if cfg.model_dir is not None:
            directory, kind = cfg.model_dir, "model files"
        else:
            self.stage(f"preparing the {'full-size' if cfg.full else 'reduced'} stand-in flow")
            directory, kind = (
                ensure_standin_flow(reduced=not cfg.full, seed=cfg.seed),
                "stand-in (seeded random weights)",
            )
        try:
            flow = load_flow(directory, device=device)
        except (OSError, ValueError) as exc:
            raise BenchSetupError(f"cannot load the flow from {directory}: {exc}") from exc
        self.report.weights = {"kind": kind, "path": str(directory), "config": asdict(flow.config)}
        return flow

    def _run(self) -> None:
        cfg = self.config
        try:
            device = resolve_device(cfg.device)
        except ValueError as exc:
            raise BenchSetupError(str(exc)) from exc
        self.report.environment = run_environment(device, cfg.threads)
        flow = self._load(device)
        frames = 2 * (cfg.prompt_tokens + cfg.gen_tokens + cfg.final_tokens)
        if frames > 15000:
            raise BenchSetupError(
                f"prompt + generated = {frames} mel frames; the flow's noise table holds 15000 (300 s): "
                "use fewer --chunks, a smaller --hop-tokens or a shorter prompt"
            )
        g = torch.Generator().manual_seed(cfg.seed)
        prompt = (
            torch.randint(0, 6561, (1, cfg.prompt_tokens), generator=g).to(device),
            (torch.randn(1, 2 * cfg.prompt_tokens, 80, generator=g) * 0.5 - 4.0).to(device),
            torch.randn(1, 192, generator=g).to(device),
        )
        tokens = torch.randint(0, 6561, (1, cfg.gen_tokens), generator=g).to(device)
        # the last call's tokens, drawn after the chunks' (which stay those of earlier runs)
        tail = torch.randint(0, 6561, (1, cfg.final_tokens), generator=g).to(device)
        hops = [cfg.first_hop] + [cfg.hop_tokens] * (cfg.chunks - 1)
        from vllm_omni_token2wav import platforms

        platform = platforms.current_omni_platform

        def sync() -> None:
            if device.type != "cpu":
                platform.synchronize()

        self.stage("warm-up chunk")
        warm: list[ChunkCost] = []
        measure_chunk_costs(
            flow,
            prompt,
            tokens,
            hops[:2],
            n_timesteps=cfg.n_timesteps,
            baseline_at=(1,),
            sync=sync,
            report=warm,
            setup_ms=[],
        )
        with progress(total=cfg.repeats * cfg.chunks, desc="chunks", unit="chunk") as bar:
            for _ in range(cfg.repeats):
                measure_chunk_costs(
                    flow,
                    prompt,
                    torch.cat([tokens, tail], dim=1),
                    hops,
                    n_timesteps=cfg.n_timesteps,
                    baseline_at=cfg.baseline_at,
                    sync=sync,
                    report=self.report.chunks,
                    setup_ms=self.report.setup_ms,
                    on_chunk=bar.update,
                    final=self.report.final,
                )
