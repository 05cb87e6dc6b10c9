# SPDX-License-Identifier: Apache-2.0
"""Cost per chunk vs chunk index of CosyVoice3's streaming flow: cached stream vs upstream's prefix re-run.

Upstream streams the flow by re-running it over prompt + every token so far for each chunk, so chunk
k costs O(k); the in-tree stream (`layers/flow_cosyvoice3/streaming.py`) computes only the new frames from
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
chunks' mel lie apart. The measuring steps (`measure_chunk_costs`, `measure_final_chunk`, `ChunkCost`) are
the shipped stage report's (`vllm-omni-token2wav bench token2wav --family cosyvoice3`,
`vllm_omni_token2wav/benchmarks/token2wav/cosyvoice3/chunk_costs.py`), so both curves time the same calls.
Rendering lives in `report.py` beside it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from vllm_omni_token2wav.benchmarks.common import (
    resolve_device,
    run_environment,
    stamp_load_at_end,
    torch_threads,
)
from vllm_omni_token2wav.benchmarks.progress import progress
from vllm_omni_token2wav.benchmarks.token2wav.cosyvoice3.chunk_costs import (
    ChunkCost,
    FinalChunkCost,
    StreamSetupError,
    StreamShape,
    measure_chunk_costs,
)

DEFAULT_BASELINE_AT: tuple[int, ...] = (1, 2, 5, 10, 20, 30, 40, 50)


#: An input of the run cannot be used (the message says which); the measuring steps raise it too.
BenchSetupError = StreamSetupError


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
    def shape(self) -> StreamShape:
        return StreamShape(prompt_tokens=self.prompt_tokens, hop_tokens=self.hop_tokens, chunks=self.chunks)

    @property
    def first_hop(self) -> int:
        return self.shape.first_hop

    @property
    def gen_tokens(self) -> int:
        return self.shape.gen_tokens


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
