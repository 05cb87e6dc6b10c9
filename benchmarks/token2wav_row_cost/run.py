# SPDX-License-Identifier: Apache-2.0
"""Where a row's milliseconds go in the Token2Wav stage, one request per forward vs. R rows per forward.

`token2wav-serve` says what batching buys end to end; this module says why, and what it could
still buy. It drives the stage model (`MiniCPMO45Code2Wav`) through its real `forward` with
steady-state chunks (chunk 1 of fresh streams: 28 tokens, 8 + 50 mel frames for HiFT, a 6 s prompt
cache), and for each row count R in `rows`:

- **batched**: R streams' chunks in ONE `forward`;
- **solo**: the same R chunks (other streams, same tokens and voices) in R forwards of one row;

timed with the wall clock (or, `clock="cpu"`, the thread's CPU time: see `token2wav_serve`), no
profiler, interleaved (the mode that runs first alternates per repetition), minimum over `reps`.
Components are timed by wrapping, on this stage instance only, the backend's two launches
(`run_flow`, `run_vocoder`), the conformer encoder's `forward_chunk` (per row), and HiFT's `source`
(F0 + NSF excitation, per row) and `decode` (the convolution stack and iSTFT); the estimator is the
flow launch minus its encoder calls, the engine is the forward minus both launches (contract,
admission, planning, commit).

From the batched launch times t(R) a least-squares line `t(R) = per_launch + per_row x R` splits
each part into what batching amortises (`per_launch`) and what it cannot (`per_row`). The upper
bound of the batched/solo ratio at R rows is then `solo(R) / (per_launch / R + per_row)` summed
over the parts, and at R -> infinity `solo / per_row`: what "ideal batching" (every per-launch cost
gone) could give on this host with these kernels. A torch profiler pass at `profile_rows` adds the
share of each op category (GEMM, attention, convolution, elementwise, RNG, copies, FFT) in both
modes, scaled to the measured wall time per row.
"""

from __future__ import annotations

import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from vllm_omni_token2wav.benchmarks.common import stamp_load_at_end, torch_threads
from vllm_omni_token2wav.benchmarks.token2wav_serve.run import (
    CLOCKS,
    StageRecipe,
    check_clock,
    forward_step,
    load_stage,
    reference_pool,
)
from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import ChunkPayload, ProducerStream, all_chunks

SCHEMA: Final = "vllm-omni/bench-token2wav-row-cost/1"
MODES: Final = ("batched", "solo")
#: Timed parts, in table order; `forward` is the whole call, the others add up to it.
PARTS: Final = ("forward", "engine", "encoder", "estimator", "source", "decode", "vocoder_other")
LAUNCHES: Final = ("flow", "vocoder")
#: Op categories of the profile: the first pattern an op name contains decides.
CATEGORIES: Final = (
    ("attention", ("scaled_dot_product", "_flash_attention", "softmax")),
    ("gemm", ("addmm", "aten::mm", "bmm", "matmul", "aten::linear")),
    ("convolution", ("conv", "slow_conv", "mkldnn")),
    ("rng", ("normal_", "uniform_", "random_")),
    ("fft", ("fft", "stft")),
    ("sine", ("aten::sin", "aten::cos")),
    ("copy / cat / gather", ("copy_", "aten::cat", "index", "stack", "_to_copy", "clone", "contiguous", "pad")),
    ("elementwise / norm", ("aten::",)),
)


class RowCostSetupError(Exception):
    """An input of the run cannot be used; the message says which."""


@dataclass(frozen=True)
class RowCostConfig:
    full: bool = False
    device: str = "cpu"
    rows: tuple[int, ...] = (1, 2, 4, 8, 16)
    reps: int = 5
    profile_rows: int = 8
    n_timesteps: int = 10
    reference_seconds: float = 6.0
    voices: int = 3
    threads: int = 1
    seed: int = 0
    clock: str = "wall"

    def validate(self) -> None:
        check_clock(self.clock, self.device, self.threads)
        if not self.rows or any(r < 1 for r in self.rows) or len(set(self.rows)) != len(self.rows):
            raise ValueError(f"rows must be distinct counts >= 1, got {self.rows}")
        for name, low in (("reps", 1), ("profile_rows", 0), ("n_timesteps", 1), ("voices", 0), ("threads", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if not self.reference_seconds > 0:
            raise ValueError(f"reference_seconds must be > 0, got {self.reference_seconds}")


#: Smoke sizes for tests (explicit options win).
SMOKE: Final[dict[str, Any]] = {"rows": (1, 2), "reps": 1, "profile_rows": 2, "n_timesteps": 2, "voices": 1}


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares `y = intercept + slope x` -> (intercept, slope); one point: (0, y / x)."""
    if len(xs) != len(ys) or not xs:
        raise ValueError(f"fit_line: {len(xs)} x values and {len(ys)} y values")
    if len(set(xs)) == 1:
        return 0.0, statistics.fmean(ys) / xs[0]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def category(op: str) -> str:
    for name, patterns in CATEGORIES:
        if any(p in op for p in patterns):
            return name
    return "other"


@dataclass
class PartClock:
    """Seconds (by `now`) spent in each wrapped part since the last `reset`."""

    now: Callable[[], float] = time.perf_counter
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def reset(self) -> None:
        self.seconds = defaultdict(float)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = self.now()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += self.now() - start

        return timed


@contextmanager
def instrumented(stage: Any, clock: PartClock) -> Iterator[None]:
    """Time the stage's launches and kernels by wrapping them on this stage instance (restored after)."""
    backend, core = stage.backend, stage.token2wav
    targets = [
        (backend, "run_flow", "flow"),
        (backend, "run_vocoder", "vocoder"),
        (core.flow.encoder, "forward_chunk", "encoder"),
        (core.hift, "source", "source"),
        (core.hift, "decode", "decode"),
    ]
    for obj, attr, name in targets:
        # An instance attribute shadows the method for this object only; nn.Module keeps plain callables in __dict__.
        object.__setattr__(obj, attr, clock.wrap(name, getattr(obj, attr)))
    try:
        yield
    finally:
        for obj, attr, _ in targets:
            obj.__dict__.pop(attr, None)


def split_parts(forward_s: float, seconds: dict[str, float]) -> dict[str, float]:
    """Wall seconds of one mode's forwards split into `PARTS` (they add up to `forward`)."""
    flow, vocoder = seconds.get("flow", 0.0), seconds.get("vocoder", 0.0)
    encoder, source, decode = seconds.get("encoder", 0.0), seconds.get("source", 0.0), seconds.get("decode", 0.0)
    return {
        "forward": forward_s,
        "engine": forward_s - flow - vocoder,
        "encoder": encoder,
        "estimator": flow - encoder,
        "source": source,
        "decode": decode,
        "vocoder_other": vocoder - source - decode,
        "flow": flow,
        "vocoder": vocoder,
    }


@dataclass
class RowCostReport:
    config: dict[str, Any]
    command: str = ""
    environment: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, Any] = field(default_factory=dict)
    #: rows -> mode -> part -> milliseconds per row (minimum over repetitions of the mode's total).
    per_row_ms: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict)
    #: mode -> category -> milliseconds per row at `profile_rows` (profile shares x wall time).
    profile_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    complete: bool = False

    def model(self) -> dict[str, Any]:
        """The per-launch / per-row split of each launch part and the ratio bounds it implies."""
        rows = sorted(self.per_row_ms)
        if not rows:
            return {}
        out: dict[str, Any] = {"parts": {}}
        for part in (*LAUNCHES, "engine"):
            launch_ms = [self.per_row_ms[r]["batched"][part] * r for r in rows]
            per_launch, per_row = fit_line([float(r) for r in rows], launch_ms)
            out["parts"][part] = {"per_launch_ms": per_launch, "per_row_ms": per_row}
        # A row alone: the mean of the solo measurements (every R runs the same solo chunks).
        solo = statistics.fmean(self.per_row_ms[r]["solo"]["forward"] for r in rows)
        fits = list(out["parts"].values())
        # A negative term means the timings were too noisy for the line (a loaded host): no bound then.
        sane = len(rows) > 1 and all(p["per_row_ms"] > 0 and p["per_launch_ms"] >= 0 for p in fits)
        ideal_row = sum(p["per_row_ms"] for p in fits)
        out["solo_row_ms"] = solo
        out["ideal_batched_row_ms"] = ideal_row if sane else None
        out["ratio_bound_infinite_rows"] = solo / ideal_row if sane else None
        out["ratio_bound"] = {}
        out["ratio_measured"] = {}
        for r in sorted({*rows, 8, 32}):
            modelled = sum(p["per_launch_ms"] / r + p["per_row_ms"] for p in fits)
            out["ratio_bound"][r] = solo / modelled if sane else None
        for r in rows:
            batched = self.per_row_ms[r]["batched"]["forward"]
            out["ratio_measured"][r] = self.per_row_ms[r]["solo"]["forward"] / batched if batched > 0 else None
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "benchmark": "token2wav_row_cost",
            "complete": self.complete,
            "command": self.command,
            "config": self.config,
            "environment": self.environment,
            "weights": self.weights,
            "per_row_ms": {str(r): modes for r, modes in sorted(self.per_row_ms.items())},
            "model": self.model(),
            "profile_ms": self.profile_ms,
        }


class Token2WavRowCost:
    """Builds the stage once, then measures every row count in both modes (see the module docstring)."""

    def __init__(self, config: RowCostConfig, stage: Callable[[str], None] | None = None) -> None:
        config.validate()
        self.config = config
        cfg = asdict(config)
        cfg["rows"] = list(config.rows)
        self.report = RowCostReport(config=cfg)
        self._stage_msg = stage or (lambda _text: None)
        self._serial = 0

    def run(self) -> RowCostReport:
        with torch_threads(self.config.threads), stamp_load_at_end(lambda: self.report.environment):
            self._run()
        self.report.complete = True
        return self.report

    # ---- setup ------------------------------------------------------------------------------------

    def _build_stage(self) -> Any:
        cfg = self.config
        most = max(max(cfg.rows), cfg.profile_rows)
        built = load_stage(
            StageRecipe(
                device=cfg.device,
                model_dir=None,
                full=cfg.full,
                family="minicpmo_4_5",
                n_timesteps=cfg.n_timesteps,
                reference_seconds=cfg.reference_seconds,
                max_rows=most,
                max_streams=4 * most + 8,
                seed=cfg.seed,
                threads=cfg.threads,
            ),
            self._stage_msg,
            RowCostSetupError,
        )
        self.report.environment, self.report.weights = built.environment, built.weights
        return built.stage

    def _streams(self, stage: Any, count: int, pool: Sequence[Any]) -> list[list[ChunkPayload]]:
        """`count` new requests of 3 chunks (first, steady, last); seeded codes, voices in rotation."""
        rng = random.Random(self.config.seed * 7 + count)
        out = []
        for i in range(count):
            self._serial += 1
            codes = [rng.randrange(6561) for _ in range(75)]
            voice = None if not pool or i % (len(pool) + 1) == 0 else pool[i % (len(pool) + 1) - 1]
            out.append(all_chunks(ProducerStream(f"row-cost-{self._serial}", codes, stage.family, voice=voice)))
        return out

    # ---- measurement ----------------------------------------------------------------------------

    def _run(self) -> None:
        cfg = self.config
        self._stage_msg("loading the stage")
        stage = self._build_stage()
        pool = reference_pool(cfg.voices, max(cfg.reference_seconds, 1.0)) if cfg.voices else []
        self._stage_msg("warming up")
        self._measure(stage, 2, pool)  # voices prepared, kernels warm
        clock = PartClock(CLOCKS[cfg.clock])
        with instrumented(stage, clock):
            for r in cfg.rows:
                self._stage_msg(f"{r} rows: {cfg.reps} repetitions x (batched, solo)")
                best: dict[str, tuple[float, dict[str, float]]] = {}
                for rep in range(cfg.reps):
                    order = MODES if rep % 2 == 0 else MODES[::-1]
                    for mode in order:
                        forward_s = self._measure(stage, r, pool, solo=mode == "solo", clock=clock)
                        if mode not in best or forward_s < best[mode][0]:
                            best[mode] = (forward_s, dict(clock.seconds))
                self.report.per_row_ms[r] = {
                    mode: {k: v * 1e3 / r for k, v in split_parts(*best[mode]).items()} for mode in MODES
                }
        if cfg.profile_rows:
            self._stage_msg(f"profiling {cfg.profile_rows} rows in both modes")
            self.report.profile_ms = {mode: self._profile(stage, pool, mode == "solo") for mode in MODES}

    def _measure(
        self, stage: Any, rows: int, pool: Sequence[Any], *, solo: bool = False, clock: PartClock | None = None
    ) -> float:
        """Wall seconds of the steady-state chunks of `rows` fresh streams (their first chunks untimed);
        `clock` holds the parts of the timed forwards only."""
        streams = self._streams(stage, rows, pool)
        _forward(stage, [s[0] for s in streams])
        if clock is not None:
            clock.reset()
        now = CLOCKS[self.config.clock]
        start = now()
        if solo:
            for s in streams:
                _forward(stage, [s[1]])
        else:
            _forward(stage, [s[1] for s in streams])
        seconds = now() - start
        stage.on_requests_finished([s[0].request_id for s in streams])
        return seconds

    def _profile(self, stage: Any, pool: Sequence[Any], solo: bool) -> dict[str, float]:
        from torch.profiler import ProfilerActivity, profile

        rows = self.config.profile_rows
        wall = min(self._measure(stage, rows, pool, solo=solo) for _ in range(2))
        streams = self._streams(stage, rows, pool)
        _forward(stage, [s[0] for s in streams])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            if solo:
                for s in streams:
                    _forward(stage, [s[1]])
            else:
                _forward(stage, [s[1] for s in streams])
        stage.on_requests_finished([s[0].request_id for s in streams])
        totals: dict[str, float] = defaultdict(float)
        for event in prof.key_averages():
            totals[category(event.key)] += event.self_cpu_time_total
        profiled = sum(totals.values())
        scale = wall * 1e3 / rows / profiled if profiled > 0 else 0.0
        return {name: us * scale for name, us in sorted(totals.items(), key=lambda kv: -kv[1])}


def _forward(stage: Any, payloads: Sequence[ChunkPayload]) -> None:
    outputs, _ = forward_step(stage, payloads)
    errors = [e for _, e in outputs if e is not None]
    if errors:
        raise RuntimeError(f"token2wav-row-cost: a segment failed: {errors[0]}")


__all__ = [
    "CATEGORIES",
    "MODES",
    "PARTS",
    "SCHEMA",
    "SMOKE",
    "RowCostConfig",
    "RowCostReport",
    "RowCostSetupError",
    "Token2WavRowCost",
    "category",
    "fit_line",
    "split_parts",
]
