# SPDX-License-Identifier: Apache-2.0
"""What a stage model has served, as cumulative counters in a JSON file: the engine tests' window into the worker.

Engine tests run the stage inside vLLM-Omni's worker process, which the test cannot read. With
`VLLM_OMNI_TOKEN2WAV_STAGE_STATS=<path>` set (`envs.py`) the stage model writes its `StageStats`
to `<path>` after every `forward` call and every `on_requests_finished`, atomically
(`atomic_io.write_json_atomic`: a reader sees the previous file or the new one, never half of one).
Unset, a call costs one environment lookup and no counter is kept.

A write is about 0.5 ms of CPU, but each of its file calls releases the GIL and may give up the
core: on an oversubscribed host the served benchmark measured 8-80 ms of wall time per write, added
to every step. `VLLM_OMNI_TOKEN2WAV_STAGE_STATS_INTERVAL_S=<s>` lets `forward` write at most once
per `<s>` seconds (the counters themselves are always updated); `on_requests_finished` and a
`forward` that raised always write, so the file is current once the engine has finished a
request. The default (0) writes after every call, which tests that read the file between calls rely on.

| field                   | meaning (cumulative since the first call with the variable set)                   |
|-------------------------|-----------------------------------------------------------------------------------|
| `pid`                   | the worker process                                                                |
| `family`                | the stage's family (`minicpmo_4_5`, `step_audio2`, `cosyvoice3`)                  |
| `forward_calls`         | every `forward` call, profiling passes included                                   |
| `steps_with_work`       | calls with at least one segment carrying work (a chunk or a whole utterance)      |
| `segments`              | segments of non-profiling calls, of every kind                                    |
| `max_segments_per_step` | the most segments one non-profiling call held                                     |
| `multi_request_steps`   | calls with two or more segments carrying work (requests batched in one step)      |
| `placeholder_segments`  | segments without work and without error (pre-warm / sync placeholders)            |
| `errors`                | segments answered with an error (unreadable input or a failed launch)             |
| `live_streams`          | streams alive after the call                                                      |
| `streams_finished`      | streams ended by their last chunk, plus live streams freed by `on_requests_finished` |
| `last_error`            | the latest segment error message, or `<Exception>: <text>` of a call that raised  |
| `noise_seeds`           | state key -> the NSF noise seed of the stream the stage opened (or the whole      |
|                         | utterance it ran) for it: `meta.seed` / `seed`, else derived from the request id  |
| `chunks`                | state key -> `[tokens, last]` of every segment served for it without error, in    |
|                         | order (a whole utterance is one `[tokens, true]`)                                 |
| `voices`                | state key -> the voice key of the first segment that named a voice for it (the     |
|                         | stage's content key: CosyVoice3's talker conditioning is `talker:<sha256>` of its |
|                         | tokens, mel and embedding as the stage read them; tests recompute it from what   |
|                         | the producer sent)                                                                |
| `torch_threads`         | `torch.get_num_threads()` in the worker at the latest non-profiling call          |
| `work_forward_s`        | wall seconds inside `forward` calls that carried work (parse, engine, output)     |
| `work_forward_cpu_s`    | the calling thread's CPU seconds in those calls (`time.thread_time`)              |
| `steps_by_rows`         | per number of work segments in a call (`"3"`): `{"steps": n, "seconds": s,        |
|                         | "cpu_seconds": c}`, the same times split by rows (benchmarks compare them with    |
|                         | in-process steps)                                                                 |
| `stats_write_s`         | wall seconds spent writing this file (what the counters themselves cost a step)   |
| `memory_budget_bytes`   | the stage's memory budget (`token2wav_memory_budget`, `memory_budget.py`); null: none |
| `live_stream_bytes`     | bytes the live streams hold after the latest call (own, plus each voice's shared once) |
| `waiting_streams`       | requests waiting for memory after the latest call (their chunks held, no audio yet) |
| `waiting_bytes`         | the estimated bytes of those waiting streams                                      |
| `bytes_per_token`       | own bytes per received token measured on committed streams (a new stream's       |
|                         | estimate where the backend has no `estimate_stream_bytes`; 0 where it has one)    |
| `budget_waits`          | streams that had to wait for memory (cumulative)                                  |
| `budget_refusals`       | segments refused by the budget: a stream that can never fit, or one whose last    |
|                         | chunk arrived while it still waited (cumulative)                                  |

`noise_seeds`, `chunks` and `voices` keep the latest `KEYS_KEPT` keys (oldest dropped first). The state key is
the engine's request id as the runner passes it (`request_ids`), which carries a suffix the engine
adds to the caller's id (`r2` -> `r2-a9cf3b8b`): tests map their ids to keys by prefix, rebuild a
streamed request's noise from its seed (no seed reaches the stage on the streaming path) and compare
its chunking with their own.

The timings are the host's wall clock around the call (`time.perf_counter`, no device
synchronisation: on CPU that is the stage's compute plus any time other threads held the core; on an
asynchronous device, what the host spent until `forward` returned) and the calling thread's CPU
time (with one torch thread on CPU: the stage's compute alone). They cost four clock reads per call,
and only with the variable set.

One file per stage model instance is the intended use; two stage models given the same path overwrite
each other's counters.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import torch

from vllm_omni_token2wav import envs
from vllm_omni_token2wav.atomic_io import write_json_atomic
from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.models.token2wav_stage.contract import Segment, SegmentKind, SegmentResult
from vllm_omni_token2wav.model_executor.models.token2wav_stage.memory_budget import MemorySnapshot

logger = init_logger(__name__)

#: How many request keys `noise_seeds` and `chunks` keep (a long-lived test server sees many requests).
KEYS_KEPT = 256


@dataclass
class StageStats:
    """The counters of the module table (mutable: one instance per stage model, updated in place)."""

    family: str
    pid: int = field(default_factory=os.getpid)
    forward_calls: int = 0
    steps_with_work: int = 0
    segments: int = 0
    max_segments_per_step: int = 0
    multi_request_steps: int = 0
    placeholder_segments: int = 0
    errors: int = 0
    live_streams: int = 0
    streams_finished: int = 0
    last_error: str | None = None
    noise_seeds: dict[str, int] = field(default_factory=dict)
    chunks: dict[str, list[tuple[int, bool]]] = field(default_factory=dict)
    voices: dict[str, str] = field(default_factory=dict)
    torch_threads: int | None = None
    work_forward_s: float = 0.0
    work_forward_cpu_s: float = 0.0
    steps_by_rows: dict[str, dict[str, float]] = field(default_factory=dict)
    stats_write_s: float = 0.0
    memory_budget_bytes: int | None = None
    live_stream_bytes: int = 0
    waiting_streams: int = 0
    waiting_bytes: int = 0
    bytes_per_token: float = 0.0
    budget_waits: int = 0
    budget_refusals: int = 0

    def record_step(
        self,
        segments: Sequence[Segment],
        results: Sequence[SegmentResult],
        *,
        profiling: bool,
        live_streams: int,
        seeds: Mapping[str, int] | None = None,
        seconds: float = 0.0,
        cpu_seconds: float = 0.0,
    ) -> None:
        """Count one `forward` call: its segments, what each produced, new streams' seeds, wall and CPU seconds."""
        self.forward_calls += 1
        self.live_streams = live_streams
        if profiling:
            return
        self.torch_threads = torch.get_num_threads()
        self.segments += len(segments)
        self.max_segments_per_step = max(self.max_segments_per_step, len(segments))
        work = sum(1 for s in segments if s.kind is not SegmentKind.PLACEHOLDER)
        self.steps_with_work += work >= 1
        self.multi_request_steps += work >= 2
        if work:
            self.work_forward_s += seconds
            self.work_forward_cpu_s += cpu_seconds
            bucket = self.steps_by_rows.setdefault(str(work), {"steps": 0, "seconds": 0.0, "cpu_seconds": 0.0})
            bucket["steps"] += 1
            bucket["seconds"] += seconds
            bucket["cpu_seconds"] += cpu_seconds
        for seg, result in zip(segments, results, strict=True):
            if result.error is not None:
                self.errors += 1
                self.last_error = result.error
            elif seg.kind is SegmentKind.PLACEHOLDER:
                self.placeholder_segments += 1
            elif seg.kind is SegmentKind.CHUNK and seg.chunk is not None and seg.chunk.last:
                self.streams_finished += 1
            if result.error is None and seg.kind is not SegmentKind.PLACEHOLDER:
                last = seg.kind is SegmentKind.WHOLE or (seg.chunk is not None and seg.chunk.last)
                _keep(self.chunks, seg.key, [*self.chunks.get(seg.key, []), (len(seg.tokens), last)])
            if seg.voice is not None and seg.key not in self.voices:
                _keep(self.voices, seg.key, seg.voice.key)
        for key, seed in (seeds or {}).items():
            _keep(self.noise_seeds, key, seed)

    def record_memory(self, snapshot: MemorySnapshot, *, waits: int, refusals: int) -> None:
        """The memory budget after a call: budget, live and waiting bytes, and the cumulative waits / refusals."""
        self.memory_budget_bytes = snapshot.budget_bytes
        self.live_stream_bytes = snapshot.live_bytes
        self.waiting_streams = snapshot.waiting_streams
        self.waiting_bytes = snapshot.waiting_bytes
        self.bytes_per_token = snapshot.bytes_per_token
        self.budget_waits = waits
        self.budget_refusals = refusals

    def record_failure(self, message: str, *, live_streams: int) -> None:
        """Count a `forward` call that raised (a step breaking the contract itself, or an engine bug)."""
        self.forward_calls += 1
        self.live_streams = live_streams
        self.last_error = message

    def record_finished(self, freed: int, *, live_streams: int) -> None:
        """Count the live streams `on_requests_finished` freed."""
        self.streams_finished += freed
        self.live_streams = live_streams


def _keep(table: dict, key: str, value: object) -> None:
    """`table[key] = value` as the newest entry, dropping the oldest beyond `KEYS_KEPT`."""
    table.pop(key, None)
    table[key] = value
    while len(table) > KEYS_KEPT:
        del table[next(iter(table))]


class StatsWriter:
    """Keeps a stage model's `StageStats` and writes them where `VLLM_OMNI_TOKEN2WAV_STAGE_STATS` says."""

    def __init__(self, family: str) -> None:
        self.family = family
        self.stats: StageStats | None = None
        self._write_failed = False
        self._last_write = float("-inf")

    def target(self) -> StageStats | None:
        """The counters to update, or None when the variable is unset (then nothing is counted)."""
        if envs.stage_stats_path() is None:
            return None
        if self.stats is None:
            self.stats = StageStats(self.family)
        return self.stats

    def _interval_s(self) -> float:
        """The write interval; a malformed value is logged once and means 0 (a step must never fail on it)."""
        try:
            return envs.stage_stats_interval_s()
        except ValueError as exc:
            if not self._write_failed:
                logger.warning("token2wav stage: %s; writing the stats file after every call", exc)
            self._write_failed = True
            return 0.0

    def write(self, *, force: bool = True) -> None:
        """Write the counters atomically; a failed write is logged once and never fails the step.

        `force=False` (after a `forward`) skips the write when the last one is more recent than
        `VLLM_OMNI_TOKEN2WAV_STAGE_STATS_INTERVAL_S`.
        """
        path = envs.stage_stats_path()
        if path is None or self.stats is None:
            return
        start = time.perf_counter()
        if not force and start - self._last_write < self._interval_s():
            return
        self._last_write = start
        try:
            write_json_atomic(path, asdict(self.stats))
        except OSError as exc:
            if not self._write_failed:  # once per stage: the same failure would repeat on every call
                logger.warning("token2wav stage: cannot write %s=%s: %s", envs.STAGE_STATS_ENV, path, exc)
            self._write_failed = True
        self.stats.stats_write_s += time.perf_counter() - start  # in the next write: the file lags by one call


__all__ = ["KEYS_KEPT", "StageStats", "StatsWriter"]
