# SPDX-License-Identifier: Apache-2.0
"""Cost per chunk of the causal HiFT's bounded streaming vs upstream CosyVoice3's cumulative re-run.

Upstream CosyVoice3 (`CosyVoice3Model.token2wav`; vLLM-Omni 0.30 before its bounded-vocoder PR)
streams the vocoder by re-running `hift.inference(all_mel_so_far, finalize=False)` every chunk and
keeping the samples past the previous end: chunk k vocodes k chunks of mel, so the cost per chunk
grows with the utterance (reported 110 -> ~300 ms per chunk over 53 chunks on an L20X).
`CausalHiFTStreamer` carries a per-request state instead and vocodes only the new frames.

One run pushes the same mel through both, chunk by chunk in lockstep on one model (which of the
two goes first alternates per chunk, so load drifting on a shared host hits both alike), timing
every call with the platform synchronised. `runs` passes give a median per chunk index; the
report has both curves, their ratio at chunks 20 and 50, the streaming RTF of each (sum of chunk
times / audio seconds), the first chunk's time, the whole-utterance `inference` time for scale,
and the largest difference between the two streams' audio (they must agree: same emission
schedule, same numbers up to float32 rounding).

Default input: the deterministic reduced stand-in (`--full`: the shipped geometry, 20.8 M
parameters; `--hift`: a real hift.pt), 55 chunks of 50 mel frames (25 tokens, ~1 s each), a
flow-shaped stand-in mel. `benchmarks.causal_hift_stream.report` renders the report.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import torch

from vllm_omni_token2wav.benchmarks.common import load_average, resolve_device, run_environment, timed_ms, torch_threads
from vllm_omni_token2wav.benchmarks.progress import progress
from vllm_omni_token2wav.benchmarks.token2wav.cosyvoice3.chunk_costs import cumulative_vocode
from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

SCHEMA: Final = "vllm-omni/bench-causal-hift/1"
FRAME_SAMPLES: Final = 480
OUTPUT_RATE: Final = 24_000
RATIO_AT: Final = (20, 50)  # chunk numbers (1-based) the ratio is reported at
MODES: Final = ("bounded", "cumulative")


class BenchSetupError(Exception):
    """An input of the run (hift.pt, device, sizes) cannot be used; the message says which and why."""


@dataclass(frozen=True)
class StreamBenchConfig:
    """What to measure (the CLI fills it)."""

    hift: Path | None = None  # None: the stand-in (reduced unless `full`)
    full: bool = False
    device: str = "auto"
    chunks: int = 55
    chunk_frames: int = 50
    runs: int = 1
    warmup_chunks: int = 3
    threads: int = 2
    seed: int = 0

    def validate(self) -> None:
        if self.hift is not None and self.full:
            raise BenchSetupError("--full selects the full-size stand-in; it cannot be combined with --hift")
        for name, low in (("chunks", 1), ("chunk_frames", 1), ("runs", 1), ("warmup_chunks", 0), ("threads", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise BenchSetupError(f"{name} must be an int >= {low}, got {value!r}")

    @property
    def frames(self) -> int:
        return self.chunks * self.chunk_frames

    @property
    def audio_seconds(self) -> float:
        return self.frames * FRAME_SAMPLES / OUTPUT_RATE


@dataclass
class StreamBenchReport:
    """Everything one run produced; `to_dict()` is the JSON document. Times in milliseconds."""

    config: dict[str, Any]
    command: str = ""
    environment: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, Any] = field(default_factory=dict)
    chunk_ms: dict[str, list[list[float]]] = field(default_factory=lambda: {m: [] for m in MODES})
    whole_ms: list[float] = field(default_factory=list)
    max_abs_diff: float | None = None
    peak_abs: float | None = None
    complete: bool = False

    def median_chunk_ms(self, mode: str) -> list[float]:
        """Median over the complete runs per chunk index (the runs so far if none completed)."""
        runs = self.chunk_ms[mode]
        count = max((len(r) for r in runs), default=0)
        return [statistics.median(r[i] for r in runs if len(r) > i) for i in range(count)]

    def ratio_at(self, chunk: int) -> float | None:
        bounded, cumulative = self.median_chunk_ms("bounded"), self.median_chunk_ms("cumulative")
        if len(bounded) < chunk or len(cumulative) < chunk or bounded[chunk - 1] <= 0:
            return None
        return cumulative[chunk - 1] / bounded[chunk - 1]

    def rtf(self, mode: str) -> float | None:
        medians = self.median_chunk_ms(mode)
        if not medians:
            return None
        audio = len(medians) * self.config["chunk_frames"] * FRAME_SAMPLES / OUTPUT_RATE
        return sum(medians) / 1000.0 / audio

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for mode in MODES:
            medians = self.median_chunk_ms(mode)
            out[mode] = {
                "first_chunk_ms": medians[0] if medians else None,
                "last_chunk_ms": medians[-1] if medians else None,
                "total_ms": sum(medians) if medians else None,
                "rtf": self.rtf(mode),
            }
        out["ratio_cumulative_over_bounded"] = {str(k): self.ratio_at(k) for k in RATIO_AT}
        out["whole_utterance_ms"] = statistics.median(self.whole_ms) if self.whole_ms else None
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "benchmark": "causal_hift_stream",
            "complete": self.complete,
            "command": self.command,
            "config": self.config,
            "environment": self.environment,
            "weights": self.weights,
            "summary": self.summary(),
            "audio_max_abs_diff": self.max_abs_diff,
            "audio_peak_abs": self.peak_abs,
            "median_chunk_ms": {m: self.median_chunk_ms(m) for m in MODES},
            "runs_chunk_ms": self.chunk_ms,
            "whole_ms": self.whole_ms,
        }


class CausalHiFTStreamBenchmark:
    """One run of the report. `run()` fills `self.report` as it goes (Ctrl-C keeps what was measured)."""

    def __init__(self, config: StreamBenchConfig, stage: Callable[[str], None] | None = None) -> None:
        config.validate()
        self.config = config
        self.report = StreamBenchReport(config={**asdict(config), "hift": str(config.hift) if config.hift else None})
        self._stage = stage if stage is not None else (lambda text: logger.info("%s", text))

    def run(self) -> StreamBenchReport:
        with torch_threads(self.config.threads), torch.inference_mode():
            try:
                self._run()
            finally:
                if self.report.environment:
                    self.report.environment["loadavg_end"] = load_average()
        self.report.complete = True
        return self.report

    def _model(self, device: torch.device) -> Any:
        from vllm_omni_token2wav.model_executor.layers.hift_causal import (
            cached_standin_causal_hift,
            load_causal_hift,
        )

        cfg = self.config
        if cfg.hift is not None:
            if not cfg.hift.is_file():
                raise BenchSetupError(f"--hift {cfg.hift}: no such file")
            path, kind = cfg.hift, "hift.pt"
        else:
            self._stage("preparing the stand-in causal hift.pt (generated once, cached)")
            path = cached_standin_causal_hift(reduced=not cfg.full, seed=cfg.seed)
            kind = f"{'full-size' if cfg.full else 'reduced'} stand-in (seeded random weights)"
        try:
            model = load_causal_hift(path, device=device)
        except ValueError as exc:
            raise BenchSetupError(str(exc)) from None
        self.report.weights = {
            "kind": kind,
            "path": str(path),
            "parameters": sum(p.numel() for p in model.parameters()),
            "noise": model.noise.identity,
        }
        return model

    def _run(self) -> None:
        from vllm_omni_token2wav import platforms
        from vllm_omni_token2wav.model_executor.layers.hift_causal import (
            COSYVOICE3_STREAM,
            CausalHiFTStreamer,
            standin_mel,
        )

        cfg = self.config
        try:
            device = resolve_device(cfg.device)
        except ValueError as exc:
            raise BenchSetupError(str(exc)) from None
        self.report.environment = run_environment(device, cfg.threads)
        model = self._model(device)
        platform = platforms.current_omni_platform

        def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
            out: list[Any] = []
            ms = timed_ms(lambda: out.append(fn()), lambda: platform.synchronize(device))
            return out[0], ms

        mel = standin_mel(cfg.frames, seed=cfg.seed).to(device)
        streamer = CausalHiFTStreamer(model, COSYVOICE3_STREAM)
        warm = min(cfg.warmup_chunks, cfg.chunks)
        if warm:
            self._stage(f"warm-up: {warm} chunk(s) of each mode")
            self._lockstep(streamer, model, mel[..., : warm * cfg.chunk_frames], timed, record=False)
        whole_mel = mel
        for run in range(cfg.runs):
            self._stage(f"run {run + 1}/{cfg.runs}: {cfg.chunks} chunks x {cfg.chunk_frames} frames, both modes")
            self._lockstep(streamer, model, mel, timed, record=True)
            _, ms = timed(lambda: model.inference(whole_mel))
            self.report.whole_ms.append(ms)

    def _lockstep(
        self,
        streamer: Any,
        model: Any,
        mel: torch.Tensor,
        timed: Callable[[Callable[[], Any]], tuple[Any, float]],
        *,
        record: bool,
    ) -> None:
        cfg = self.config
        chunks = mel.shape[-1] // cfg.chunk_frames
        times: dict[str, list[float]] = {m: [] for m in MODES}
        if record:
            for m in MODES:
                self.report.chunk_ms[m].append(times[m])
        state = streamer.start()
        offset = 0
        outputs: dict[str, list[torch.Tensor]] = {m: [] for m in MODES}
        with progress(total=chunks, desc="chunks", unit="chunk", enabled=record) as bar:
            for k in range(chunks):
                end = (k + 1) * cfg.chunk_frames
                last = k == chunks - 1

                def bounded(end: int = end, last: bool = last) -> torch.Tensor:
                    nonlocal state
                    audio, state = streamer.push(state, mel[..., end - cfg.chunk_frames : end], finalize=last)
                    return audio

                def cumulative(end: int = end, last: bool = last) -> torch.Tensor:
                    nonlocal offset
                    speech, offset = cumulative_vocode(model, mel[..., :end], offset, finalize=last)
                    return speech

                calls = {"bounded": bounded, "cumulative": cumulative}
                for mode in MODES if k % 2 == 0 else MODES[::-1]:
                    audio, ms = timed(calls[mode])
                    times[mode].append(ms)
                    outputs[mode].append(audio)
                bar.update()
        if record and self.report.max_abs_diff is None:
            a, b = (torch.cat(outputs[m], dim=-1).float().cpu() for m in MODES)
            if a.shape != b.shape:
                raise RuntimeError(f"bounded and cumulative streams emitted {a.shape[-1]} vs {b.shape[-1]} samples")
            self.report.max_abs_diff = (a - b).abs().max().item()
            self.report.peak_abs = b.abs().max().item()


__all__ = [
    "MODES",
    "RATIO_AT",
    "BenchSetupError",
    "CausalHiFTStreamBenchmark",
    "StreamBenchConfig",
    "StreamBenchReport",
    "cumulative_vocode",
]
