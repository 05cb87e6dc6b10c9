# SPDX-License-Identifier: Apache-2.0
"""Soak and burst through the real served stack: does one server stay whole, flat and steady over many requests?

`--engine` (`engine.py` beside this module) measures a few dozen requests per level. A deployment
serves thousands, so what matters there is what only shows over time: a request that fails once in
a few hundred, memory that grows with every request (a cache or a per-request buffer that is never
freed), first-audio latency that drifts upward. `--engine --soak` answers those for the stand-in
stream deployment (`deploy/standin_step_audio2_stream.yaml`: the stand-in producer feeding our
Step-Audio2 code2wav through vLLM-Omni's own chunk transfer, the same stack `--engine` serves):

- **one server** (`vllm-omni-token2wav serve`, deploy overlay on the shipped YAML: the reply length
  and, with `max_num_seqs`, both stages' slots; by default the shipped YAML's), warmed by a WAV
  request whose header must say 24 kHz, then two at once;
- **sustained**: `requests` streamed requests (distinct texts) in one closed loop at `concurrency`;
- **burst**: then `burst_requests` at `burst_concurrency` (above the stages' `max_num_seqs`, the
  engine queues the rest: what a traffic spike does);
- **settle**: a few seconds idle, so the memory after the burst is sampled too.

What is measured: every request's TTFP, RTF and length from the listener's side (the emulated
benchmark's `RequestResult`); the resident memory of the server's whole process tree (API server,
engine cores, workers: `/proc/<pid>/smaps_rollup` Rss and Pss summed) every `rss_interval_s`,
with the number of requests finished at that moment; the stage's own error counter
(`VLLM_OMNI_TOKEN2WAV_STAGE_STATS`). The report (`SoakReport`) gives per window of `window`
requests (by send order) TTFP p50/p99, RTF p50, audio s/s and failures, so drift shows; the RSS
slope by least squares over the sustained phase (MB per minute and per 100 requests, whole phase
and its second half: after the allocators' warm-up); and a verdict: **pass** only when every
request finished whole (no error, exactly the reply's samples) and the stage counted no error.
The JSON is rewritten (atomically) after each finished window, so a long run that dies leaves
what it measured.
"""

from __future__ import annotations

import functools
import os
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from vllm_omni_token2wav.benchmarks.common import load_average, stamp_load_at_end
from vllm_omni_token2wav.benchmarks.engine_server import EngineServer
from vllm_omni_token2wav.benchmarks.speech_stream_client import (
    ServedRequest,
    run_closed_or_poisson,
    stream_speech,
)
from vllm_omni_token2wav.benchmarks.token2wav_serve.engine import (
    ENGINE_INSTALL_HINT,
    environment_with_engine,
    missing_engine,
    read_overlay,
    read_stats,
    served_standin,
    shipped_deploy,
    warm_up_server,
    write_overlay,
)
from vllm_omni_token2wav.benchmarks.token2wav_serve.run import SAMPLE_RATE, TOKEN_RATE, RequestResult, percentiles
from vllm_omni_token2wav.envs import STAGE_STATS_ENV, STAGE_STATS_INTERVAL_ENV

SCHEMA: Final = "vllm-omni/bench-token2wav-serve-soak/1"
PHASES: Final = ("sustained", "burst")
SETTLE_S: Final = 10.0  # idle after the burst, sampled: does memory come back down
STATS_INTERVAL_S: Final = 5.0  # the worker's counters file at most this often (only its error count is read)
_STATS_WAIT_S: Final = 10.0


class SoakSetupError(Exception):
    """An input of the soak run cannot be used (the message says which)."""


@dataclass(frozen=True)
class SoakConfig:
    """What to serve. Defaults: 1,000 requests at c = 8, then 128 at c = 64, 2 s replies, windows of 100."""

    requests: int = 1000
    concurrency: int = 8
    burst_requests: int = 128
    burst_concurrency: int = 64
    audio_seconds: float = 2.0  # every reply: the producer's max_tokens = audio_seconds x 25
    window: int = 100  # requests per TTFP window (by send order)
    rss_interval_s: float = 2.0
    max_num_seqs: int | None = None  # both stages' max_num_seqs; None: the shipped deploy YAML's
    seed: int = 0
    plan: str = "soak"
    startup_timeout_s: float = 900.0
    request_timeout_s: float = 600.0
    server_logs: Path | None = None

    def validate(self) -> None:
        for name in ("requests", "concurrency", "window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.burst_requests < 0 or self.burst_concurrency < 1:
            raise ValueError(
                f"burst: requests must be >= 0 and concurrency >= 1, got {self.burst_requests} "
                f"at c={self.burst_concurrency}"
            )
        if not 0.2 <= self.audio_seconds <= 120:
            raise ValueError(f"audio_seconds must be in [0.2, 120], got {self.audio_seconds}")
        if not self.rss_interval_s > 0:
            raise ValueError(f"rss_interval_s must be > 0, got {self.rss_interval_s}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")

    @property
    def tokens(self) -> int:
        return max(1, round(self.audio_seconds * TOKEN_RATE))


#: Sizes by plan (explicit options win). `soak-smoke`: seconds of requests for the CI test.
PLANS: Final[dict[str, dict[str, Any]]] = {
    "soak": {},
    "soak-smoke": {
        "requests": 32,
        "burst_requests": 16,
        "burst_concurrency": 16,
        "audio_seconds": 1.0,
        "window": 8,
        "rss_interval_s": 0.5,
    },
}


# ---------------------------------------------------------------------------------------------
# Memory of the server's process tree
# ---------------------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            text = Path(f"/proc/{pid}/task/{task}/children").read_text()
            out += [int(p) for p in text.split()]
    except OSError:
        pass
    return out


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (Linux `/proc`), parents first."""
    tree, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        if p in tree:
            continue
        tree.append(p)
        todo += _children(p)
    return tree


def process_memory_kb(pid: int) -> tuple[int, int | None] | None:
    """(Rss kB, Pss kB) of one process from `smaps_rollup` (Pss None where only `status` is readable); None if gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        values = {
            k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in text.splitlines()[1:] if ":" in line)
        }
        return values["Rss"], values.get("Pss")
    except (OSError, KeyError, ValueError):
        pass
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]), None
    except (OSError, ValueError):
        return None
    return None


def tree_memory_mb(pid: int) -> dict[str, Any] | None:
    """Rss and Pss (decimal MB) summed over `pid`'s process tree, and its process count; None if `pid` is gone."""
    rss = pss = 0
    count = 0
    pss_known = True
    for p in process_tree(pid):
        mem = process_memory_kb(p)
        if mem is None:
            continue
        count += 1
        rss += mem[0]
        if mem[1] is None:
            pss_known = False
        else:
            pss += mem[1]
    if count == 0:
        return None
    return {"rss_mb": rss * 1.024e-3, "pss_mb": pss * 1.024e-3 if pss_known else None, "processes": count}


def tree_breakdown(pid: int) -> list[dict[str, Any]]:
    """Per process of `pid`'s tree: pid, name (`comm`: vLLM names its engine cores and workers), Rss and Pss MB."""
    out = []
    for p in process_tree(pid):
        mem = process_memory_kb(p)
        if mem is None:
            continue
        try:
            name = Path(f"/proc/{p}/comm").read_text().strip()
        except OSError:
            name = "?"
        out.append(
            {
                "pid": p,
                "name": name,
                "rss_mb": mem[0] * 1.024e-3,
                "pss_mb": None if mem[1] is None else mem[1] * 1.024e-3,
            }
        )
    return out


def least_squares_slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """The slope of the least-squares line through (xs, ys); None with fewer than 2 distinct xs."""
    if len(xs) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


@dataclass(frozen=True)
class MemorySample:
    t_s: float  # since the sustained phase began (negative: before it)
    phase: str  # "warm", "sustained", "burst", "settle"
    finished: int  # requests finished (all phases) when sampled
    rss_mb: float
    pss_mb: float | None
    processes: int


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


@dataclass
class SoakRequest:
    """One streamed request of the soak: its phase, its index in the phase, and the listener's record."""

    phase: str
    index: int
    result: RequestResult
    finished_s: float | None = None  # since the sustained phase began


@dataclass
class SoakReport:
    config: dict[str, Any]
    command: str = ""
    environment: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    server: dict[str, Any] = field(default_factory=dict)
    requests: list[SoakRequest] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)  # started_s, ended_s, loadavg
    stage_errors: int = 0
    stage_last_error: str | None = None
    notes: list[str] = field(default_factory=list)
    complete: bool = False

    # ---- per request ----

    @property
    def expected_samples(self) -> int:
        return round(self.config["tokens_per_request"] / TOKEN_RATE * SAMPLE_RATE)

    def failure(self, req: SoakRequest) -> str | None:
        """Why a finished request failed (an error, or a reply not exactly the deployment's length), else None."""
        r = req.result
        if r.errors:
            return r.errors[0]
        if req.finished_s is not None and abs(r.samples - self.expected_samples) > 1:
            return f"reply of {r.samples} samples, expected {self.expected_samples}"
        return None

    def failures(self) -> list[tuple[SoakRequest, str]]:
        out = []
        for req in self.requests:
            why = self.failure(req)
            if why is not None:
                out.append((req, why))
        return out

    def planned(self, phase: str) -> int:
        return int(self.config["requests"] if phase == "sustained" else self.config["burst_requests"])

    def verdict(self) -> dict[str, Any]:
        """`passed` only if the run completed, every planned request finished whole, and the stage counted no error."""
        failures = self.failures()
        finished = {p: sum(1 for r in self.requests if r.phase == p and r.finished_s is not None) for p in PHASES}
        unfinished = sum(self.planned(p) - finished[p] for p in PHASES)
        reasons = []
        if failures:
            reasons.append(
                f"{len(failures)} request(s) failed, first {failures[0][0].result.request_id}: {failures[0][1]}"
            )
        if unfinished:
            reasons.append(f"{unfinished} planned request(s) did not finish")
        if self.stage_errors:
            reasons.append(f"the stage counted {self.stage_errors} error(s): {self.stage_last_error}")
        if not self.complete:
            reasons.append("the run did not complete")
        return {"passed": not reasons, "failures": len(failures), "unfinished": unfinished, "reasons": reasons}

    def failed(self) -> bool:
        return not self.verdict()["passed"]

    # ---- windows ----

    def _stats(self, reqs: list[SoakRequest]) -> dict[str, Any]:
        done = [r for r in reqs if r.finished_s is not None]
        ok = [r.result for r in done if self.failure(r) is None]
        first = min((r.result.arrival_s for r in done), default=None)
        last = max((r.result.deliveries[-1][0] for r in done if r.result.deliveries), default=None)
        span = None if first is None or last is None else last - first
        audio = sum(r.audio_s for r in ok)
        ttfp = [t for t in (r.ttfp_s() for r in ok) if t is not None]
        rtf = [v for v in (r.rtf() for r in ok) if v is not None]
        plays = [r.playback() for r in ok]
        return {
            "requests": len(reqs),
            "finished": len(done),
            "failures": sum(1 for r in done if self.failure(r) is not None),
            "audio_s": audio,
            "span_s": span,
            "throughput_audio_s_per_s": audio / span if span else None,
            "ttfp_s": percentiles(ttfp),
            "rtf": percentiles(rtf),
            "underruns": sum(u for u, _ in plays),
            "started_s": first,
            "ended_s": last,
        }

    def _memory_at(self, t: float | None) -> float | None:
        """The last RSS sample at or before `t` (seconds since the sustained phase began)."""
        if t is None:
            return None
        before = [m.rss_mb for m in self.memory if m.t_s <= t]
        return before[-1] if before else None

    def windows(self) -> list[dict[str, Any]]:
        """Per `window` sustained requests by send order, then the burst as one window."""
        size = int(self.config["window"])
        out = []
        sustained = [r for r in self.requests if r.phase == "sustained"]
        for start in range(0, len(sustained), size):
            chunk = sustained[start : start + size]
            entry = {"phase": "sustained", "first": start, "last": start + len(chunk) - 1, **self._stats(chunk)}
            entry["rss_mb_end"] = self._memory_at(entry["ended_s"])
            out.append(entry)
        burst = [r for r in self.requests if r.phase == "burst"]
        if burst:
            entry = {"phase": "burst", "first": 0, "last": len(burst) - 1, **self._stats(burst)}
            entry["rss_mb_end"] = self._memory_at(entry["ended_s"])
            out.append(entry)
        return out

    # ---- memory ----

    def memory_summary(self) -> dict[str, Any]:
        """RSS per phase (first, last, peak) and the sustained phase's least-squares slopes."""
        out: dict[str, Any] = {"samples": len(self.memory), "interval_s": self.config["rss_interval_s"]}
        for phase in ("warm", *PHASES, "settle"):
            values = [m.rss_mb for m in self.memory if m.phase == phase]
            pss = [m.pss_mb for m in self.memory if m.phase == phase and m.pss_mb is not None]
            out[phase] = (
                {
                    "first_mb": values[0],
                    "last_mb": values[-1],
                    "peak_mb": max(values),
                    "samples": len(values),
                    "pss_first_mb": pss[0] if pss else None,
                    "pss_last_mb": pss[-1] if pss else None,
                }
                if values
                else None
            )
        sustained = [m for m in self.memory if m.phase == "sustained"]
        out["slope"] = _slopes(sustained)
        out["slope_second_half"] = _slopes(sustained[len(sustained) // 2 :])
        with_pss = [m for m in sustained if m.pss_mb is not None]
        out["pss_slope_mb_per_min"] = _per_min(
            least_squares_slope([m.t_s for m in with_pss], [m.pss_mb or 0.0 for m in with_pss])
        )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "benchmark": "token2wav_serve_soak",
            "complete": self.complete,
            "command": self.command,
            "config": self.config,
            "environment": self.environment,
            "model": self.model,
            "server": self.server,
            "phases": {
                p: {**info, **self._stats([r for r in self.requests if r.phase == p])}
                for p, info in self.phases.items()
            },
            "verdict": self.verdict(),
            "memory": self.memory_summary(),
            "windows": self.windows(),
            "memory_samples": [asdict(m) for m in self.memory],
            "stage_errors": self.stage_errors,
            "per_request": [
                {
                    "phase": r.phase,
                    "request_id": r.result.request_id,
                    "arrival_s": r.result.arrival_s,
                    "finished_s": r.finished_s,
                    "ttfp_s": r.result.ttfp_s(),
                    "rtf": r.result.rtf(),
                    "samples": r.result.samples,
                    "failure": self.failure(r),
                }
                for r in self.requests
            ],
            "notes": self.notes,
        }


def _per_min(slope_per_s: float | None) -> float | None:
    return None if slope_per_s is None else 60.0 * slope_per_s


def _slopes(samples: Sequence[MemorySample]) -> dict[str, Any]:
    """RSS slope over `samples`: MB per minute (against time) and MB per 100 requests (against requests finished)."""
    per_s = least_squares_slope([m.t_s for m in samples], [m.rss_mb for m in samples])
    per_request = least_squares_slope([float(m.finished) for m in samples], [m.rss_mb for m in samples])
    return {
        "mb_per_min": _per_min(per_s),
        "mb_per_100_requests": None if per_request is None else 100.0 * per_request,
        "samples": len(samples),
        "span_s": samples[-1].t_s - samples[0].t_s if samples else None,
    }


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def request_texts(phase: str, count: int, seed: int) -> list[str]:
    """Distinct texts (the stand-in producer's codes depend on the prompt only)."""
    return [f"Soak benchmark, {phase} request {i}, seed {seed}." for i in range(count)]


def shipped_max_num_seqs() -> dict[str, int]:
    """Each stage's `max_num_seqs` in the shipped deploy YAML (what the server runs without `max_num_seqs`)."""
    import yaml

    data = yaml.safe_load(shipped_deploy().read_text())
    return {f"stage_{s['stage_id']}": int(s["max_num_seqs"]) for s in data["stages"] if "max_num_seqs" in s}


class SoakBenchmark:
    """Starts one server, runs the sustained phase and the burst through it while sampling its memory, stops it."""

    def __init__(
        self,
        config: SoakConfig,
        stage: Callable[[str], None] | None = None,
        checkpoint: Callable[[SoakReport], None] | None = None,
    ) -> None:
        config.validate()
        self.config = config
        cfg = asdict(config)
        cfg["server_logs"] = None if config.server_logs is None else str(config.server_logs)
        cfg["tokens_per_request"] = config.tokens
        self.report = SoakReport(config=cfg)
        self._msg = stage or (lambda _text: None)
        self._checkpoint = checkpoint  # called (from a sampler thread) after each finished window
        self._lock = threading.Lock()
        self._origin = 0.0  # perf_counter when the sustained phase began (0 before: samples are "warm")
        self._phase = "warm"
        self._finished = 0
        self._windows_done = 0
        self._stop = threading.Event()

    def run(self) -> SoakReport:
        missing = missing_engine()
        if missing:
            raise SoakSetupError(f"--engine --soak needs {missing}; {ENGINE_INSTALL_HINT}")
        if not Path("/proc/self/smaps_rollup").exists() and not Path("/proc/self/status").exists():
            raise SoakSetupError("--soak samples the server's memory from /proc (Linux); this host has none")
        self.report.environment = environment_with_engine()
        with stamp_load_at_end(lambda: self.report.environment):
            self._run()
        self.report.complete = True
        return self.report

    def _run(self) -> None:
        cfg = self.config
        self._msg("stand-in engine model folder")
        standin = served_standin(cfg.seed, cfg.server_logs, "t2w-serve-soak-")
        self.report.model = standin.model
        model_dir, logs, keep_logs = standin.model_dir, standin.logs, standin.keep_logs
        deploy = write_overlay(
            logs, "deploy_soak", max_tokens=cfg.tokens, producer_seqs=cfg.max_num_seqs, code2wav_seqs=cfg.max_num_seqs
        )
        stats = logs / "stage_stats.json"
        server = EngineServer(
            model_dir,
            deploy,
            logs / "server.log",
            env={STAGE_STATS_ENV: str(stats), STAGE_STATS_INTERVAL_ENV: str(STATS_INTERVAL_S)},
            startup_timeout_s=cfg.startup_timeout_s,
        )
        sampler = threading.Thread(target=self._sample_loop, args=(server,), name="soak-memory", daemon=True)
        try:
            self._msg("starting the server (minutes on a 2-core CPU)")
            launched = time.perf_counter()
            server.start()
            seqs = shipped_max_num_seqs()
            if cfg.max_num_seqs is not None:
                seqs = dict.fromkeys(seqs, cfg.max_num_seqs)
            self.report.server = {
                "deploy_overlay": read_overlay(deploy),
                "max_num_seqs": seqs,
                "ready_after_s": time.perf_counter() - launched,
                "pid": server.pid,
            }
            self._warm_up(server)
            self._sample(server)  # the "warm" sample: the server as warmed, before the soak
            if server.pid is not None:
                self.report.server["processes_after_warm_up"] = tree_breakdown(server.pid)
            sampler.start()
            self._phases(server)
            self._settle(server)
            self._read_stage_errors(stats)
        except BaseException:
            keep_logs = True
            raise
        finally:
            self._stop.set()
            if sampler.is_alive():
                sampler.join(timeout=10.0)
            self._msg("stopping the server")
            server.stop()
            if self.report.failed():
                keep_logs = True
            if keep_logs:
                self.report.notes.append(f"server log kept in {logs}")
            else:
                shutil.rmtree(logs, ignore_errors=True)

    def _warm_up(self, server: EngineServer) -> None:
        """A WAV request (its header must say the stage's rate), then two at once: first-call costs go here."""
        self._msg("warming up the server")
        start = time.perf_counter()
        warm_up_server(server.port, self.config.tokens, self.config.request_timeout_s, "the server")
        self.report.server["warm_up_s"] = time.perf_counter() - start
        mem = None if server.pid is None else tree_memory_mb(server.pid)
        self.report.server["rss_mb_after_warm_up"] = None if mem is None else mem["rss_mb"]
        self.report.server["processes"] = None if mem is None else mem["processes"]

    def _phases(self, server: EngineServer) -> None:
        cfg = self.config
        self._origin = time.perf_counter()
        for phase, count, concurrency in (
            ("sustained", cfg.requests, cfg.concurrency),
            ("burst", cfg.burst_requests, cfg.burst_concurrency),
        ):
            if count == 0:
                continue
            texts = request_texts(phase, count, cfg.seed)
            requests = [ServedRequest(f"{phase}-{i}", text) for i, text in enumerate(texts)]
            records = [
                SoakRequest(phase, i, RequestResult(r.request_id, 0, cfg.tokens, 0.0, 0.0))
                for i, r in enumerate(requests)
            ]
            by_id = {r.result.request_id: r for r in records}
            started = time.perf_counter() - self._origin
            with self._lock:
                self._phase = phase
            self._sample(server)  # each phase's first sample: its start
            with self._lock:
                self.report.requests += records
                self.report.phases[phase] = {
                    "concurrency": concurrency,
                    "started_at_s": started,
                    "loadavg_start": load_average(),
                }
            self._msg(f"{phase}: {count} streamed requests at c={concurrency}")

            send = functools.partial(self._send, server.port, by_id)
            run_closed_or_poisson(server.port, requests, concurrency, timeout_s=cfg.request_timeout_s, send=send)
            self._sample(server)  # and its end
            with self._lock:
                self.report.phases[phase]["ended_at_s"] = time.perf_counter() - self._origin
                self.report.phases[phase]["loadavg_end"] = load_average()
            if not server.alive():
                self.report.notes.append(f"the server exited during the {phase} phase; log {server.log_path}")
                break

    def _send(
        self, port: int, by_id: dict[str, SoakRequest], req: ServedRequest, result: RequestResult, origin: float
    ) -> None:
        """Stream one request (a `run_closed_or_poisson` sender) and mark it finished."""
        record = by_id[req.request_id]
        # every time in the report counts from the sustained phase's start: the phase's own origin
        # (when run_closed_or_poisson began) is shifted onto that axis
        shift = origin - self._origin
        result.arrival_s += shift
        result.admitted_s += shift
        with self._lock:
            record.result = result
        stream_speech(port, req.text, result, self._origin, timeout_s=self.config.request_timeout_s)
        with self._lock:
            record.finished_s = time.perf_counter() - self._origin
            self._finished += 1

    def _settle(self, server: EngineServer) -> None:
        with self._lock:
            self._phase = "settle"
        self._msg(f"settle: {SETTLE_S:.0f} s idle, memory sampled")
        time.sleep(SETTLE_S)
        self._sample(server)
        if server.pid is not None:
            self.report.server["processes_after_settle"] = tree_breakdown(server.pid)

    def _read_stage_errors(self, stats: Path) -> None:
        deadline = time.monotonic() + _STATS_WAIT_S
        after = read_stats(stats)
        total = self.report.planned("sustained") + self.report.planned("burst")
        while after is None or after.get("streams_finished", 0) < total or after.get("live_streams"):
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
            after = read_stats(stats)
        if after is None:
            self.report.notes.append("the stage's counters file was never written: its error count is unknown")
            return
        self.report.stage_errors = int(after.get("errors", 0))
        self.report.stage_last_error = after.get("last_error")
        self.report.server["stage_streams_finished"] = after.get("streams_finished")
        self.report.server["stage_steps"] = after.get("steps")

    # ---- memory sampling and checkpoints (a thread) ----

    def _sample(self, server: EngineServer) -> None:
        mem = None if server.pid is None else tree_memory_mb(server.pid)
        if mem is None:
            return
        with self._lock:
            t = time.perf_counter() - self._origin if self._origin else 0.0
            if self.report.memory and t < self.report.memory[-1].t_s:
                return  # the sampler thread and a phase boundary raced: keep the samples in time order
            self.report.memory.append(
                MemorySample(t, self._phase, self._finished, mem["rss_mb"], mem["pss_mb"], mem["processes"])
            )

    def _sample_loop(self, server: EngineServer) -> None:
        while not self._stop.wait(self.config.rss_interval_s):
            self._sample(server)
            self._maybe_checkpoint()

    def _maybe_checkpoint(self) -> None:
        if self._checkpoint is None:
            return
        size = self.config.window
        with self._lock:
            done = sum(1 for r in self.report.requests if r.phase == "sustained" and r.finished_s is not None)
            windows = done // size
            if windows <= self._windows_done:
                return
            self._windows_done = windows
        self._checkpoint(self.report)


__all__ = [
    "PLANS",
    "SCHEMA",
    "MemorySample",
    "SoakBenchmark",
    "SoakConfig",
    "SoakReport",
    "SoakRequest",
    "SoakSetupError",
    "least_squares_slope",
    "process_tree",
    "tree_memory_mb",
]
