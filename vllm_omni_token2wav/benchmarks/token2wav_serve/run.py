# SPDX-License-Identifier: Apache-2.0
"""What concurrency costs the Token2Wav stage, driven exactly as vLLM-Omni drives it.

An operator sizing a code2wav deployment needs to know, at the concurrency they expect: when does
a listener hear the first audio (TTFP), does the stream keep up with playback (underruns), how much
audio does the stage produce per second of wall time, and what cross-request batching buys. This
module measures that on the stage model itself (`MiniCPMO45Code2Wav` by default), with the real
calling convention (`standin/chunk_producer.py`: `forward_inputs`): one flat `input_ids`, `seq_token_counts`,
`request_ids`, one producer dict per segment.

The simulation, per concurrency level c and per mode:

- N requests, each with seeded random 25 Hz codes for a seeded length in `audio_seconds`, a voice
  from a small pool (the stage's default voice and `voices` reference clips), arriving in a
  closed loop (a new request takes a slot as soon as one frees; c slots) or, with `request_rate`,
  by a Poisson process (still at most c in flight, later ones queue);
- each admitted request's talker emits codes at `talker_rate` tokens/s; its producer cuts them
  into chunks as the family's producer does (25 + 3 lookahead), a chunk being ready when its last
  token exists;
- a scheduler loop: each step puts the ready chunks (oldest request first, at most one per
  request) into ONE `forward`: up to `max_num_seqs` of them ("batched"), or exactly one
  ("one request per forward", what a stage without cross-request batching does);
- time is virtual: a step advances the clock by its measured wall time; when nothing is ready the
  clock jumps to the next ready chunk or arrival (idle time is skipped, not slept, which is what a
  host doing nothing else would see). With `clock="cpu"` (CPU, 1 thread only) a step is measured in
  the thread's CPU time instead: what the step costs on a core of its own, without the time other
  processes of a shared host took the core away (the wall clock is the default and what a quiet host
  reports).

Per request: TTFP (arrival -> first audio), audio RTF (arrival -> last audio, over the audio's
duration), underruns (a chunk delivered after the previous one finished playing, playback
starting at the first audio), total stall seconds. Per level and mode: audio seconds per wall
second, p50/p90/p99 of the per-request figures, steps and rows per step, bytes per live stream.
Both modes run in the same process on the same warmed stage (voices prepared once, before any
timing), alternating which goes first per level, so the ratio compares like with like.

Variants other tools drive through the same machinery (`build_stage`, `prepare`, `run_level`):
`whole=True` makes each request send its whole reply as one chunk once its talker is done
(MiniCPM-o's one-chunk stream: the reply's audio in one launch row); `device_graphs` is the
stage's `token2wav_device_graphs` option (the device check compares graphs on and off on one stage
with `set_device_graphs`); `run_level(..., should_stop=)` ends a level early (marked `stopped`).

The report is filled as the run progresses (an interrupted run keeps what it measured); the
rendering (table, JSON, PNG) is `report.py`.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from vllm_omni_token2wav.benchmarks.common import (
    resolve_device,
    run_environment,
    stamp_load_at_end,
    token2wav_model_dir,
    torch_threads,
)
from vllm_omni_token2wav.benchmarks.progress import progress
from vllm_omni_token2wav.benchmarks.token2wav_serve.families import FAMILIES
from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import (
    CHUNK_TOKENS,
    LOOKAHEAD_TOKENS,
    ChunkPayload,
    ProducerStream,
    all_chunks,
    forward_inputs,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage import families as family_registry
from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import segment_errors

logger = init_logger(__name__)

SCHEMA: Final = "vllm-omni/bench-token2wav-serve/1"
SAMPLE_RATE: Final = 24_000
TOKEN_RATE: Final = 25
MODES: Final = ("batched", "unbatched")


class ServeSetupError(Exception):
    """An input of the run cannot be used (model folder, device, option); the message says which."""


@dataclass(frozen=True)
class ServeConfig:
    """What to run. Defaults: the CPU plan on the reduced stand-in (under 3 minutes on 2 cores)."""

    model_dir: Path | None = None
    full: bool = False
    family: str = "minicpmo_4_5"
    device: str = "auto"
    concurrency: tuple[int, ...] = (1, 4, 8)
    requests: int | None = None  # per level; None: 3 x c, at least 4
    request_rate: float | None = None  # Poisson arrivals per second; None: closed loop
    talker_rate: float = 100.0  # codec tokens per second per request (25 = real time)
    audio_seconds: tuple[float, float] = (2.0, 4.0)
    voices: int = 3
    n_timesteps: int = 10
    reference_seconds: float = 6.0
    max_num_seqs: int | None = None  # None: the level's concurrency
    kv_cache_dtype: str | None = None
    threads: int = 1
    seed: int = 0
    plan: str = "cpu"
    clock: str = "wall"
    whole: bool = False  # each request sends its whole reply as one chunk when its talker is done
    device_graphs: bool | None = None  # the stage's token2wav_device_graphs (None: auto)

    def validate(self) -> None:
        if self.family not in FAMILIES:  # the family list's names (the command line maps the old ones)
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        check_clock(self.clock, self.device, self.threads)
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency levels must be >= 1, got {self.concurrency}")
        lo, hi = self.audio_seconds
        if not 0.2 <= lo <= hi:
            raise ValueError(f"audio_seconds must be 0.2 <= min <= max, got {self.audio_seconds}")
        if not self.talker_rate > 0 or (self.request_rate is not None and not self.request_rate > 0):
            raise ValueError("talker_rate and request_rate must be > 0")
        for name, low in (("voices", 0), ("n_timesteps", 1), ("threads", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")

    def requests_at(self, concurrency: int) -> int:
        return requests_per_level(self.requests, concurrency)


def requests_per_level(requests: int | None, concurrency: int) -> int:
    """Requests of a level: `requests` when given, else 3 x c and at least 4 (the emulated and served runs alike)."""
    return requests if requests is not None else max(3 * concurrency, 4)


#: Sizes by plan (explicit options win): the issue's concurrency levels on an accelerator.
PLANS: Final[dict[str, dict[str, Any]]] = {
    "cpu": {},
    "cpu-full": {"concurrency": (1, 2, 4), "requests": None, "audio_seconds": (2.0, 2.0), "voices": 1},
    "accelerator": {"concurrency": (1, 8, 32), "audio_seconds": (4.0, 8.0)},
    "smoke": {
        "concurrency": (1, 2),
        "requests": 2,
        "audio_seconds": (1.2, 1.6),
        "voices": 1,
        "n_timesteps": 2,
        "reference_seconds": 1.0,
    },
}


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50 / p90 / p99 (nearest rank) and the mean; None for an empty list."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

    return {"p50": rank(0.5), "p90": rank(0.9), "p99": rank(0.99), "mean": statistics.fmean(ordered)}


@dataclass
class RequestResult:
    request_id: str
    voice: int
    tokens: int
    arrival_s: float
    admitted_s: float
    deliveries: list[tuple[float, int]] = field(default_factory=list)  # (time, samples) per chunk
    errors: list[str] = field(default_factory=list)

    @property
    def samples(self) -> int:
        return sum(n for _, n in self.deliveries)

    @property
    def audio_s(self) -> float:
        return self.samples / SAMPLE_RATE

    def ttfp_s(self) -> float | None:
        first = next((t for t, n in self.deliveries if n > 0), None)
        return None if first is None else first - self.arrival_s

    def rtf(self) -> float | None:
        if not self.deliveries or self.samples == 0:
            return None
        return (self.deliveries[-1][0] - self.arrival_s) / self.audio_s

    def playback(self) -> tuple[int, float]:
        """(underruns, stall seconds): playback starts at the first audio and stalls when a chunk is late."""
        underruns, stall, end = 0, 0.0, None
        for t, n in self.deliveries:
            if n == 0:
                continue
            if end is not None and t > end:
                underruns += 1
                stall += t - end
                end = t
            end = (t if end is None else end) + n / SAMPLE_RATE
        return underruns, stall


@dataclass
class ModeRun:
    """One mode at one concurrency level."""

    mode: str
    requests: list[RequestResult] = field(default_factory=list)
    steps: list[tuple[int, float]] = field(default_factory=list)  # (rows, seconds)
    makespan_s: float = 0.0
    peak_streams: int = 0
    peak_stream_own_bytes: int = 0
    peak_shared_bytes: int = 0
    stopped: bool = False  # ended early by `should_stop` (figures cover what was delivered)

    def summary(self) -> dict[str, Any]:
        audio = sum(r.audio_s for r in self.requests)
        plays = [r.playback() for r in self.requests]
        return {
            "mode": self.mode,
            "stopped": self.stopped,
            "requests": len(self.requests),
            "audio_s": audio,
            "makespan_s": self.makespan_s,
            "throughput_audio_s_per_s": audio / self.makespan_s if self.makespan_s > 0 else None,
            "ttfp_s": percentiles([x for r in self.requests if (x := r.ttfp_s()) is not None]),
            "rtf": percentiles([x for r in self.requests if (x := r.rtf()) is not None]),
            "stall_s": percentiles([s for _, s in plays]),
            "underruns": sum(u for u, _ in plays),
            "requests_with_underruns": sum(1 for u, _ in plays if u),
            "errors": sum(len(r.errors) for r in self.requests),
            "steps": len(self.steps),
            "rows_per_step": statistics.fmean(n for n, _ in self.steps) if self.steps else None,
            "step_s": percentiles([s for _, s in self.steps]),
            "peak_streams": self.peak_streams,
            "peak_stream_own_bytes": self.peak_stream_own_bytes,
            "peak_shared_bytes": self.peak_shared_bytes,
        }


RATIO_KEYS: Final = (
    ("throughput_audio_s_per_s", None),
    ("ttfp_s", "p50"),
    ("ttfp_s", "p90"),
    ("rtf", "p50"),
    ("rtf", "p90"),
    ("stall_s", "p90"),
)


def ratio_row(batched: dict[str, Any], unbatched: dict[str, Any]) -> dict[str, float | None]:
    """batched / unbatched for the table's columns (throughput > 1 and latencies < 1 mean batching helps)."""
    out: dict[str, float | None] = {}
    for key, sub in RATIO_KEYS:
        a, b = batched.get(key), unbatched.get(key)
        if sub is not None:
            a = a.get(sub) if isinstance(a, dict) else None
            b = b.get(sub) if isinstance(b, dict) else None
        out[key if sub is None else f"{key}_{sub}"] = a / b if a is not None and b else None
    return out


@dataclass
class ServeReport:
    config: dict[str, Any]
    command: str = ""
    environment: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, Any] = field(default_factory=dict)
    setup_s: dict[str, float] = field(default_factory=dict)
    levels: list[dict[str, Any]] = field(default_factory=list)
    runs: dict[tuple[int, str], ModeRun] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    complete: bool = False

    def to_dict(self) -> dict[str, Any]:
        levels = []
        for level in self.levels:
            c = level["concurrency"]
            modes = {m: self.runs[(c, m)] for m in MODES if (c, m) in self.runs}
            summaries = {m: run.summary() for m, run in modes.items()}
            entry: dict[str, Any] = {**level, "modes": {}}
            for m, run in modes.items():
                entry["modes"][m] = {
                    **summaries[m],
                    "per_request": [
                        {
                            **{k: v for k, v in asdict(r).items() if k != "deliveries"},
                            "ttfp_s": r.ttfp_s(),
                            "rtf": r.rtf(),
                            "audio_s": r.audio_s,
                            "underruns": r.playback()[0],
                            "stall_s": r.playback()[1],
                            "chunks": len(r.deliveries),
                        }
                        for r in run.requests
                    ],
                }
            if len(summaries) == 2:
                entry["ratio_batched_over_unbatched"] = ratio_row(summaries["batched"], summaries["unbatched"])
            levels.append(entry)
        return {
            "schema": SCHEMA,
            "benchmark": "token2wav_serve",
            "complete": self.complete,
            "command": self.command,
            "config": self.config,
            "environment": self.environment,
            "weights": self.weights,
            "setup_s": self.setup_s,
            "levels": levels,
            "notes": self.notes,
        }


# ---------------------------------------------------------------------------------------------
# Workload
# ---------------------------------------------------------------------------------------------


@dataclass
class _Request:
    result: RequestResult
    chunks: list[ChunkPayload]
    ready_after: list[float]  # seconds after admission when each chunk exists (talker timeline)
    sent: int = 0

    def next_ready(self) -> float | None:
        if self.sent >= len(self.chunks):
            return None
        return self.result.admitted_s + self.ready_after[self.sent]


def ready_offsets(chunks: Sequence[ChunkPayload], tokens: int, talker_rate: float, family: str) -> list[float]:
    """When each chunk exists, in seconds after the talker starts: when its last token is emitted."""
    out = []
    for k, chunk in enumerate(chunks):
        if chunk.last:
            needed = tokens
        elif family_registry.family(family).producer.chunking == "context_window":
            needed = CHUNK_TOKENS * (k + 1)  # 25 new codes per chunk (after the 3 context codes: MiniCPM-o)
        else:
            needed = CHUNK_TOKENS * k + CHUNK_TOKENS + LOOKAHEAD_TOKENS
        out.append(min(needed, tokens) / talker_rate)
    return out


def make_requests(
    config: ServeConfig,
    family_spec: Any,
    concurrency: int,
    prefix: str,
    pool: Sequence[Any],
    count: int | None = None,
    codes: Sequence[Sequence[int]] | None = None,
) -> list[_Request]:
    """The level's requests (same seeds for both modes): lengths, voices and codes (`count`: default per config).

    `codes` gives each request's codec tokens instead of seeded random ones (its length is the request's;
    the served benchmark replays what the engine's producer emitted).
    """
    rng = random.Random(config.seed * 1000 + concurrency)
    lo, hi = config.audio_seconds
    out = []
    if codes is not None:
        count = len(codes)
    for i in range(config.requests_at(concurrency) if count is None else count):
        if codes is not None:
            request_codes = [int(c) for c in codes[i]]
            tokens = len(request_codes)
        else:
            tokens = max(1, round(rng.uniform(lo, hi) * TOKEN_RATE))
            request_codes = [rng.randrange(6561) for _ in range(tokens)]
        voice = i % (len(pool) + 1)  # 0: the stage's default voice
        stream = ProducerStream(
            f"{prefix}-{i}", request_codes, family_spec, voice=None if voice == 0 else pool[voice - 1]
        )
        if config.whole:  # the talker is done before the stage sees anything: one chunk holding the reply
            whole = stream.next_chunk(tokens, True)
            assert whole is not None
            chunks, ready = [whole], [tokens / config.talker_rate]
        else:
            chunks = all_chunks(stream)
            ready = ready_offsets(chunks, tokens, config.talker_rate, config.family)
        out.append(_Request(RequestResult(f"{prefix}-{i}", voice, tokens, 0.0, 0.0), chunks, ready))
    return out


#: How a step's duration is measured (see the module docstring).
CLOCKS: Final[dict[str, Callable[[], float]]] = {"wall": time.perf_counter, "cpu": time.thread_time}


def check_clock(clock: str, device: str, threads: int) -> None:
    """Raise ValueError unless `clock` is known and, for the CPU clock, the run is on CPU with 1 thread.

    A thread's CPU time equals its wall time on a core of its own only when one thread does all the
    work and nothing runs asynchronously on a device.
    """
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {tuple(CLOCKS)}, got {clock!r}")
    if clock == "cpu" and (device not in ("cpu", "auto") or threads != 1):
        raise ValueError(f"the cpu clock needs --device cpu and 1 thread (got device {device!r}, {threads} threads)")


def mode_order(index: int) -> tuple[str, ...]:
    """The order of the two modes at level `index`: alternating, so drift on the host hits both alike."""
    return MODES if index % 2 == 0 else MODES[::-1]


def talker_bound(concurrency: int, talker_rate: float) -> float:
    """Audio seconds per wall second the talkers of `concurrency` requests produce at most.

    No stage can deliver audio faster than its codes exist: c requests at `talker_rate` codes/s
    (25 codes per audio second) bound either mode's throughput, so a batched/unbatched ratio can
    never exceed this bound over the unbatched throughput (at c = 8, 100 codes/s: 32 audio s/s).
    """
    return concurrency * talker_rate / TOKEN_RATE


def arrivals(config: ServeConfig, count: int, concurrency: int) -> list[float] | None:
    """Poisson arrival times (seeded), or None for the closed loop."""
    if config.request_rate is None:
        return None
    rng = random.Random(config.seed * 7919 + concurrency)
    t, out = 0.0, []
    for _ in range(count):
        t += rng.expovariate(config.request_rate)
        out.append(t)
    return out


def reference_pool(count: int, seconds: float) -> list[tuple[np.ndarray, int]]:
    """`count` different reference voices: stretches of the shipped speech clip (tiled as needed)."""
    from vllm_omni_token2wav.assets.audio import speech_sample

    wav, rate = speech_sample()
    want = int(seconds * rate)
    tiled = np.tile(wav, -(-(want + count * rate // 2) // wav.shape[0]) + 1)
    return [(np.ascontiguousarray(tiled[k * rate // 2 : k * rate // 2 + want]), rate) for k in range(1, count + 1)]


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageRecipe:
    """How a benchmark builds the stage model (as the runner would, with keyword overrides)."""

    device: str
    model_dir: Path | None
    full: bool
    family: str
    n_timesteps: int
    reference_seconds: float
    max_rows: int
    max_streams: int
    seed: int
    threads: int
    kv_cache_dtype: str | None = None
    device_graphs: bool | None = None  # the stage's token2wav_device_graphs (None: auto)
    graph_api: Any = None  # a fake device-graph runtime (tests); None: the platform's


@dataclass
class BuiltStage:
    """A loaded stage model and what a report says about it (host, weights, load seconds)."""

    stage: Any
    environment: dict[str, Any]
    weights: dict[str, Any]
    load_s: float


def load_stage(recipe: StageRecipe, stage_msg: Callable[[str], None], error: type[Exception]) -> BuiltStage:
    """The stage model of `recipe`, loaded, with the report's host and weights descriptions.

    Unusable inputs (device, model folder, options) raise `error` with the message saying which.
    """
    try:
        device = resolve_device(recipe.device)
    except ValueError as exc:
        raise error(str(exc)) from exc
    environment = run_environment(device, recipe.threads)
    model_dir, weights = token2wav_model_dir(
        recipe.model_dir, reduced=not recipe.full, seed=recipe.seed, stage=stage_msg, error=error
    )
    stage_cls = family_registry.import_target(family_registry.family(recipe.family).serving.stage_class)
    try:
        stage = stage_cls(
            model=str(model_dir),
            device=device,
            n_timesteps=recipe.n_timesteps,
            reference_seconds=recipe.reference_seconds,
            max_rows=recipe.max_rows,
            max_streams=recipe.max_streams,
            seed=recipe.seed,
            kv_cache_dtype=recipe.kv_cache_dtype,
            device_graphs=recipe.device_graphs,
            **({} if recipe.graph_api is None else {"device_graph_api": recipe.graph_api}),
        )
    except (FileNotFoundError, ValueError) as exc:
        raise error(str(exc)) from exc
    start = time.perf_counter()
    stage.load_weights([])
    load_s = time.perf_counter() - start
    weights["family"] = type(stage).__name__
    return BuiltStage(stage, environment, weights, load_s)


class Token2WavServeBenchmark:
    """Builds the stage once, warms it, then runs every level in both modes (see the module docstring)."""

    def __init__(self, config: ServeConfig, stage: Callable[[str], None] | None = None) -> None:
        config.validate()
        self.config = config
        self.report = ServeReport(config=_config_dict(config))
        self._stage_msg = stage or (lambda _text: None)

    def run(self) -> ServeReport:
        with torch_threads(self.config.threads), stamp_load_at_end(lambda: self.report.environment):
            self._run()
        self.report.complete = True
        return self.report

    def build_stage(self, graph_api: Any = None) -> Any:
        """The stage model on the configured device and weights, loaded (`graph_api`: a fake runtime for tests)."""
        cfg = self.config
        max_rows = cfg.max_num_seqs or max(cfg.concurrency)
        built = load_stage(
            StageRecipe(
                device=cfg.device,
                model_dir=cfg.model_dir,
                full=cfg.full,
                family=cfg.family,
                n_timesteps=cfg.n_timesteps,
                reference_seconds=cfg.reference_seconds,
                max_rows=max_rows,
                max_streams=max(2 * max_rows, 16),
                seed=cfg.seed,
                threads=cfg.threads,
                kv_cache_dtype=cfg.kv_cache_dtype,
                device_graphs=cfg.device_graphs,
                graph_api=graph_api,
            ),
            self._stage_msg,
            ServeSetupError,
        )
        self.report.environment, self.report.weights = built.environment, built.weights
        self.report.setup_s["load_s"] = built.load_s
        return built.stage

    def prepare(self, stage: Any) -> list[tuple[np.ndarray, int]]:
        """Prepare every voice of the pool and run one warm-up request; returns the pool (untimed setup)."""
        cfg = self.config
        pool = reference_pool(cfg.voices, max(cfg.reference_seconds, 1.0))
        self._stage_msg(f"preparing {len(pool) + 1} voices and warming up")
        start = time.perf_counter()
        warm = make_requests(cfg, stage.family, 1, "warmup", pool)[:1]
        for voice in [None, *pool]:
            stage.executor.voice(None if voice is None else _voice_request(voice))
        for req in warm:
            for chunk in req.chunks:
                forward_step(stage, [chunk], CLOCKS[cfg.clock])
        stage.on_requests_finished([r.result.request_id for r in warm])
        self.report.setup_s["voices_and_warmup_s"] = time.perf_counter() - start
        return pool

    def _run(self) -> None:
        cfg = self.config
        self._stage_msg("loading the stage")
        stage = self.build_stage()
        pool = self.prepare(stage)
        for index, c in enumerate(cfg.concurrency):
            self.run_both_modes(stage, index, c, pool)

    def run_both_modes(
        self,
        stage: Any,
        index: int,
        concurrency: int,
        pool: Sequence[Any],
        codes: Sequence[Sequence[int]] | None = None,
    ) -> dict[str, Any]:
        """Level `index` of the run at `concurrency`: both modes, the first alternating by level; returns the level.

        `codes`: each request's codec tokens (default: the config's seeded random requests).
        """
        cfg = self.config
        level: dict[str, Any] = {
            "concurrency": concurrency,
            "requests": cfg.requests_at(concurrency) if codes is None else len(codes),
            "max_num_seqs": cfg.max_num_seqs or concurrency,
            "talker_rate": cfg.talker_rate,
            "talker_bound_audio_s_per_s": talker_bound(concurrency, cfg.talker_rate),
        }
        order = mode_order(index)
        level["order"] = list(order)
        self.report.levels.append(level)
        for mode in order:
            rows = (cfg.max_num_seqs or concurrency) if mode == "batched" else 1
            self.report.runs[(concurrency, mode)] = self.run_level(stage, concurrency, mode, rows, pool, codes=codes)
        return level

    def run_level(
        self,
        stage: Any,
        concurrency: int,
        mode: str,
        max_rows: int,
        pool: Sequence[Any],
        should_stop: Callable[[], bool] | None = None,
        count: int | None = None,
        label: str | None = None,
        codes: Sequence[Sequence[int]] | None = None,
    ) -> ModeRun:
        """One level: `concurrency` slots, steps of at most `max_rows` chunks (`should_stop()` ends it early).

        `count` overrides the config's number of requests; `label` (default `mode`) prefixes request ids;
        `codes` gives each request's codec tokens (`make_requests`).
        """
        cfg = self.config
        prefix = f"c{concurrency}-{label or mode}"
        requests = make_requests(cfg, stage.family, concurrency, prefix, pool, count, codes)
        times = arrivals(cfg, len(requests), concurrency)
        run = ModeRun(mode)
        run.requests = [r.result for r in requests]
        waiting = list(range(len(requests)))  # request indices not yet admitted, in order
        active: list[_Request] = []
        now = 0.0
        total_chunks = sum(len(r.chunks) for r in requests)
        with progress(total=total_chunks, desc=f"c={concurrency} {mode}", unit="chunk") as bar:
            while waiting or active:
                if should_stop is not None and should_stop():
                    run.stopped = True
                    break
                while waiting and len(active) < concurrency:
                    arrival = 0.0 if times is None else times[waiting[0]]
                    if times is not None and arrival > now:
                        break
                    req = requests[waiting.pop(0)]
                    req.result.arrival_s = now if times is None else arrival
                    req.result.admitted_s = now
                    active.append(req)
                ready = [r for r in active if (t := r.next_ready()) is not None and t <= now]
                if not ready:
                    upcoming = [t for r in active if (t := r.next_ready()) is not None]
                    if waiting and times is not None and len(active) < concurrency:
                        upcoming.append(times[waiting[0]])
                    now = max(now, min(upcoming))
                    continue
                ready.sort(key=lambda r: (r.result.arrival_s, r.result.request_id))
                batch = ready[:max_rows]
                outputs, seconds = forward_step(stage, [r.chunks[r.sent] for r in batch], CLOCKS[cfg.clock])
                now += seconds
                run.steps.append((len(batch), seconds))
                for req, (audio, error) in zip(batch, outputs, strict=True):
                    req.result.deliveries.append((now, audio))
                    if error is not None:
                        req.result.errors.append(error)
                    req.sent += 1
                    bar.update()
                self._memory(stage, run)
                active = [r for r in active if r.sent < len(r.chunks)]
        run.makespan_s = max((r.deliveries[-1][0] for r in run.requests if r.deliveries), default=0.0) - min(
            (r.arrival_s for r in run.requests), default=0.0
        )
        stage.on_requests_finished([r.request_id for r in run.requests])
        if any(r.errors for r in run.requests):
            first = next(e for r in run.requests for e in r.errors)
            self.report.notes.append(f"c={concurrency} {mode}: segments failed, first: {first}")
        return run

    @staticmethod
    def _memory(stage: Any, run: ModeRun) -> None:
        usage = stage.executor.stream_bytes()
        run.peak_streams = max(run.peak_streams, len(usage))
        if usage:
            run.peak_stream_own_bytes = max(run.peak_stream_own_bytes, max(u.own for u in usage))
            run.peak_shared_bytes = max(run.peak_shared_bytes, max(u.shared for u in usage))


def _voice_request(voice: tuple[np.ndarray, int]) -> Any:
    from vllm_omni_token2wav.model_executor.models.token2wav_stage.voice import requested_voice

    return requested_voice(voice[0], voice[1], None)


def forward_step(
    stage: Any, payloads: Sequence[ChunkPayload], clock: Callable[[], float] = time.perf_counter
) -> tuple[list[tuple[int, str | None]], float]:
    """One `forward` of the stage on `payloads`: ((samples, error) per segment, seconds incl. device sync)."""
    from vllm_omni_token2wav import platforms

    input_ids, kwargs = forward_inputs(payloads, stage.family)
    platform = platforms.current_omni_platform
    start = clock()
    out = stage(input_ids, None, **kwargs).multimodal_outputs
    platform.synchronize()
    seconds = clock() - start
    return [
        (int(a.numel()), e) for a, e in zip(out[stage.family.output_key], segment_errors(out), strict=True)
    ], seconds


def _config_dict(config: ServeConfig) -> dict[str, Any]:
    out = asdict(config)
    out["model_dir"] = str(config.model_dir) if config.model_dir is not None else None
    out["concurrency"] = list(config.concurrency)
    out["audio_seconds"] = list(config.audio_seconds)
    return out


__all__ = [
    "CLOCKS",
    "FAMILIES",
    "MODES",
    "PLANS",
    "SCHEMA",
    "ModeRun",
    "BuiltStage",
    "RequestResult",
    "ServeConfig",
    "ServeReport",
    "ServeSetupError",
    "StageRecipe",
    "Token2WavServeBenchmark",
    "load_stage",
    "check_clock",
    "forward_step",
    "make_requests",
    "mode_order",
    "percentiles",
    "requests_per_level",
    "ratio_row",
    "ready_offsets",
    "talker_bound",
]
