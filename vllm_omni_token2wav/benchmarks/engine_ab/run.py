# SPDX-License-Identifier: Apache-2.0
"""vLLM-Omni 0.30's own code2wav stage classes against ours, in the same real engine, same run (`bench engine-ab`).

What a user would run instead of this fork is vLLM-Omni as shipped. This module serves, per family, one of two
routes twice on loopback, on the same stand-in folder (`standin/model_dirs.py`):

- **alone** (`deploy/<family>_code2wav.yaml`): the family's code2wav stage alone; a request is codec ids
  (docs/design/token2wav_stage.md "Requests without a producer") posted to `/v1/completions`.
- **pipeline** (`pipeline.py`): upstream's own multi-stage pipeline at toy size (its deploy YAML, its thinker /
  talker with random weights, `standin/toy/`) in BOTH arms, only the code2wav class differing; a request is
  text streamed from the family's endpoint (Step-Audio2 `/v1/audio/speech`, MiniCPM-o `/v1/chat/completions`).
- **stream** (`deploy/standin_<family>_stream.yaml`): our stand-in producer in front of the code2wav stage,
  joined by upstream's own async-chunk function for the family (`plugins/pipelines.py`); a request is text
  streamed as raw PCM from `/v1/audio/speech`, so TTFP is the first chunk's and underruns are real. The
  producer is the same in both arms (8 sequences); its codes are a function of the text, so both arms decode
  the same codes; the deploy's `max_tokens` is the reply length. Only families whose upstream async-chunk
  function reads the producer's token ids (`STREAM_FAMILIES`).

On either route the two arms are:

- **upstream**: `VLLM_OMNI_TOKEN2WAV_OVERRIDES=0` in that server's environment (`plugins/overrides.py`: the
  plugin still registers the pipeline, but the architecture names keep vLLM-Omni's classes), with the
  code2wav `max_num_seqs` that vLLM-Omni's own deploy YAML for the model uses (`UPSTREAM_DEPLOYS`; the value
  is read from the installed vLLM-Omni and the report names the file and stage it came from).
- **ours**: our deploy YAML (our classes, batched; on the stream route only the reply length is set).

Both servers start side by side and stay up; every concurrency level sends the same requests (the same codes,
the stage's default voice: neither endpoint's request carries one here) to one arm, then the other, the order
alternating per level, so host noise falls on both (closed loop of `c`, `speech_stream_client.
run_closed_or_poisson`). Alone: the completions reply carries no audio (vLLM's completions endpoint drops the
stage's multimodal output), so a request's audio is the `tokens x 960` samples its codes stand for when it
answers HTTP 200, delivered at the reply: TTFP is the whole-utterance latency, RTF latency / audio seconds, and
underruns are 0 by construction (the stage alone serves whole utterances). Stream: every PCM read is a
delivery; a reply that ends with other than `tokens x 960` samples is a failed request.

The upstream arm's `cosyvoice2` shim sizes the streaming flow's scratch buffers from the model
(`dit_scratch.py`: upstream hard-codes them for the full-size flow; the arithmetic is unchanged).

Peak RSS is the sum over the server's process group (API server, engine core, worker), sampled every
`RSS_PERIOD_S`. With `faults` (alone route: the stand-in producer only emits codes in range), each arm then
gets 8 concurrent requests of which one has an out-of-range code: how many of the 8 got audio, the bad one's
error, whether the engine survived (a good request afterwards succeeds) and how long after the wave that first
success came.

An arm that does not start, or fails its warm-up request, is data, not a crash: its status, a reason and the
first error line of its log go into the report and the other arm still runs. The report is written after every
arm's level (`on_update`), so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from vllm_omni_token2wav.benchmarks.common import cpu_model, load_average, usable_cores
from vllm_omni_token2wav.benchmarks.engine_ab.families import FAMILIES, STREAM_FAMILIES, UPSTREAM_DEPLOYS
from vllm_omni_token2wav.benchmarks.engine_server import EngineServer, EngineServerError
from vllm_omni_token2wav.benchmarks.speech_stream_client import (
    SPEECH_PATH,
    ServedRequest,
    error_message,
    run_closed_or_poisson,
    stream_speech,
)
from vllm_omni_token2wav.benchmarks.token2wav_serve.run import SAMPLE_RATE, TOKEN_RATE, ModeRun, RequestResult
from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

SCHEMA: Final = "vllm-omni/bench-engine-ab/1"
ARMS: Final = ("upstream", "ours")
ROUTES: Final = ("alone", "stream", "pipeline")
PRODUCER_SEQS: Final = 8  # the stand-in producer's max_num_seqs in both arms of the stream route
CODEBOOK: Final = 6561  # every family's speech tokens are in [0, 6561)
SAMPLES_PER_TOKEN: Final = SAMPLE_RATE // TOKEN_RATE
OVERRIDES_ENV: Final = "VLLM_OMNI_TOKEN2WAV_OVERRIDES"  # plugins/overrides.py (not imported: it needs vLLM)
#: On the upstream arm's PYTHONPATH: a `cosyvoice2` shim, the package upstream's Step-Audio2 / MiniCPM-o
#: `flow.yaml` tags name (`upstream_path/cosyvoice2/__init__.py` says how it is provided).
UPSTREAM_PATH: Final = Path(__file__).resolve().with_name("upstream_path")
#: Families served from the `upstream_compatible` stand-in folder (speech tokenizer and HiFT at the sizes
#: upstream's loaders hard-code); CosyVoice3's upstream class hard-codes a full-size flow as well.
UPSTREAM_COMPATIBLE: Final = frozenset({"minicpmo_4_5", "step_audio2"})
COMPLETIONS_PATH: Final = "/v1/completions"
RSS_PERIOD_S: Final = 0.5
FAULT_REQUESTS: Final = 8
FAULT_INDEX: Final = 3  # which of the fault wave's requests is bad
BAD_CODE: Final = 7000
BAD_POSITION: Final = 9


#: Statuses of an arm: measured (`ok`, `partial`: some requests failed) or not (`start_failed`,
#: `requests_failed`: it answered no request, its warm-up included; `not_run`: the run ended before it).
STATUSES: Final = ("ok", "partial", "requests_failed", "start_failed", "not_run")


def _pipeline_families() -> tuple[str, ...]:
    from vllm_omni_token2wav.benchmarks.engine_ab.pipeline import PIPELINE_FAMILIES

    return PIPELINE_FAMILIES


#: route -> (the families it can serve, what the others lack, what produces its codes): the routes beside `alone`.
_ROUTE_LIMITS: Final[dict[str, Callable[[], tuple[tuple[str, ...], str, str]]]] = {
    "stream": lambda: (
        STREAM_FAMILIES,
        "stand-in stream deployment (its upstream async-chunk function reads its talker's multimodal output)",
        "the stand-in producer",
    ),
    "pipeline": lambda: (_pipeline_families(), "toy upstream pipeline", "upstream's talker, through its processors,"),
}


class EngineABSetupError(Exception):
    """An input of the A/B run cannot be used (the message says which)."""


@dataclass(frozen=True)
class EngineABConfig:
    """What to serve and measure. Defaults: every family, c = 1, 4, 8, c requests per level (>= 2), 2 s each."""

    families: tuple[str, ...] = FAMILIES
    route: str = "alone"
    full_size: bool = False  # the full-size stand-in folder (what upstream's classes hard-code) for every family
    concurrency: tuple[int, ...] = (1, 4, 8)
    requests: int | None = None  # per level and arm; None: c, at least 2
    audio_seconds: float = 2.0
    faults: bool = True
    seed: int = 0
    plan: str = "cpu"
    startup_timeout_s: float = 900.0
    request_timeout_s: float = 300.0
    recover_timeout_s: float = 60.0
    server_logs: Path | None = None  # keep the servers' logs here (default: a temporary folder, kept on failure)

    def validate(self) -> None:
        unknown = [f for f in self.families if f not in FAMILIES]
        if not self.families or unknown or len(set(self.families)) != len(self.families):
            raise ValueError(f"families must be distinct names of {', '.join(FAMILIES)}, got {self.families}")
        if self.route not in ROUTES:
            raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {self.route!r}")
        if self.route != "alone":
            allowed, lacking, producer = _ROUTE_LIMITS[self.route]()
            missing = [f for f in self.families if f not in allowed]
            if missing:
                raise ValueError(
                    f"route {self.route}: {', '.join(missing)} has no {lacking}; {self.route} families: "
                    f"{', '.join(allowed)}"
                )
            if self.faults:
                raise ValueError(f"the fault wave needs route alone ({producer} only forwards codes in range)")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency levels must be >= 1, got {self.concurrency}")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")
        if not 0.2 <= self.audio_seconds <= 60:
            raise ValueError(f"audio_seconds must be in [0.2, 60], got {self.audio_seconds}")
        if self.audio_seconds * TOKEN_RATE <= BAD_POSITION:
            raise ValueError(f"audio_seconds {self.audio_seconds}: the fault request needs > {BAD_POSITION} tokens")

    @property
    def tokens(self) -> int:
        return max(1, round(self.audio_seconds * TOKEN_RATE))

    def requests_at(self, concurrency: int) -> int:
        return self.requests if self.requests is not None else max(2, concurrency)


#: Sizes by plan (explicit options win). `smoke`: one level, two short requests, no fault wave (tests).
PLANS: Final[dict[str, dict[str, Any]]] = {
    "cpu": {},
    "accelerator": {"concurrency": (1, 4, 8, 16, 32), "audio_seconds": 4.0},
    "smoke": {"concurrency": (1,), "requests": 2, "audio_seconds": 0.8, "faults": False},
}


# ---------------------------------------------------------------------------------------------
# Where each arm's settings come from
# ---------------------------------------------------------------------------------------------


def upstream_max_num_seqs(family: str, deploy_dir: Path | None = None) -> tuple[int, str]:
    """The code2wav `max_num_seqs` of vLLM-Omni's own deploy YAML for `family`, and where it was read."""
    import yaml

    name, stage_id = UPSTREAM_DEPLOYS[family]
    if deploy_dir is None:  # found without importing vLLM-Omni (its import prints vLLM's log lines)
        import importlib.util

        spec = importlib.util.find_spec("vllm_omni")
        if spec is None or spec.origin is None:
            raise EngineABSetupError("vLLM-Omni is not installed: its deploy YAMLs give upstream's max_num_seqs")
        deploy_dir = Path(spec.origin).resolve().parent / "deploy"
    path = deploy_dir / name
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise EngineABSetupError(f"{path}: cannot read vLLM-Omni's deploy YAML for {family} ({exc})") from None
    for stage in document.get("stages", []):
        if stage.get("stage_id") == stage_id and "max_num_seqs" in stage:
            return int(stage["max_num_seqs"]), f"vllm_omni/deploy/{name} stage {stage_id}"
    raise EngineABSetupError(f"{path}: no stage {stage_id} with max_num_seqs (the code2wav stage of {family})")


def our_deploy(family: str, route: str = "alone") -> Path:
    """Our shipped deploy YAML of `route`: the code2wav stage alone, or behind the stand-in producer."""
    from vllm_omni_token2wav.deploy import deploy_config

    return deploy_config(f"{family}_code2wav" if route == "alone" else f"standin_{family}_stream")


def code2wav_stage_id(route: str) -> int:
    """The code2wav stage's id in our deploy YAML of `route` (alone or stream; pipeline: `pipeline.py`)."""
    return 0 if route == "alone" else 1


def our_max_num_seqs(family: str, route: str = "alone") -> int:
    import yaml

    stages = yaml.safe_load(our_deploy(family, route).read_text())["stages"]
    return int(next(s["max_num_seqs"] for s in stages if s["stage_id"] == code2wav_stage_id(route)))


def arm_environment(overrides: str) -> dict[str, str]:
    """The server environment of an arm: the overrides switch; upstream's arm also gets `UPSTREAM_PATH`."""
    env = {OVERRIDES_ENV: overrides}
    if overrides == "0":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(UPSTREAM_PATH), os.environ.get("PYTHONPATH", "")) if p)
    return env


def write_overlay(
    folder: Path, name: str, family: str, max_num_seqs: int, route: str = "alone", tokens: int | None = None
) -> Path:
    """Our deploy YAML of `route` with the code2wav `max_num_seqs` given (a `base_config:` overlay written by the
    project's one overlay writer, `standin.toy.write_overlay`; merged by stage_id); the stream route also fixes the
    producer's `max_num_seqs` and its reply length (`tokens`)."""
    from vllm_omni_token2wav.model_executor.models.standin import toy

    stages: dict[int, dict[str, Any]] = {code2wav_stage_id(route): {"max_num_seqs": max_num_seqs}}
    if route == "stream":
        if tokens is None:
            raise ValueError("write_overlay: the stream route needs the reply length (tokens)")
        stages[0] = {"max_num_seqs": PRODUCER_SEQS, "default_sampling_params": {"max_tokens": tokens}}
    return toy.write_overlay(folder / f"{name}.yaml", our_deploy(family, route), stages)


# ---------------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------------


def request_codes(seed: int, concurrency: int, index: int, tokens: int) -> list[int]:
    """The codes of request `index` of level `concurrency` (the same for both arms)."""
    rng = np.random.default_rng([seed, concurrency, index])
    return rng.integers(0, CODEBOOK, tokens).tolist()


def fault_codes(seed: int, tokens: int) -> list[list[int]]:
    """The fault wave: `FAULT_REQUESTS` requests, the one at `FAULT_INDEX` with `BAD_CODE` at `BAD_POSITION`."""
    codes = [request_codes(seed, 0, i, tokens) for i in range(FAULT_REQUESTS)]
    codes[FAULT_INDEX][BAD_POSITION] = BAD_CODE
    return codes


def _error_text(status: int, body: bytes) -> str:
    """The reply's error on one line (whitespace collapsed), at most 400 characters of message."""
    return f"HTTP {status}: {' '.join(error_message(body).split())[:400]}"


def post_codes(
    port: int, model: str, codes: Sequence[int], result: RequestResult, origin: float, *, timeout_s: float
) -> None:
    """POST `codes` to `/v1/completions`; on HTTP 200 one delivery of `len(codes) x 960` samples at the reply."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    body = json.dumps({"model": model, "prompt": list(codes), "max_tokens": 1})
    try:
        conn.request("POST", COMPLETIONS_PATH, body=body, headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        data = reply.read()
        now = time.perf_counter() - origin
        if reply.status != 200:
            result.errors.append(_error_text(reply.status, data))
        else:
            result.deliveries.append((now, len(codes) * SAMPLES_PER_TOKEN))
    except (OSError, http.client.HTTPException) as exc:
        result.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


def run_wave(
    port: int, model: str, codes: Sequence[Sequence[int]], concurrency: int, *, prefix: str, timeout_s: float
) -> list[RequestResult]:
    """Every request of `codes` as a closed loop of `concurrency`; their results (times since the wave began)."""
    by_id = {f"{prefix}-{i}": c for i, c in enumerate(codes)}

    def send(request: ServedRequest, result: RequestResult, origin: float) -> None:
        result.tokens = len(by_id[request.request_id])
        post_codes(port, model, by_id[request.request_id], result, origin, timeout_s=timeout_s)

    requests = [ServedRequest(rid, "") for rid in by_id]
    return run_closed_or_poisson(port, requests, concurrency, timeout_s=timeout_s, send=send)


def request_text(seed: int, concurrency: int, index: int) -> str:
    """The text of request `index` of level `concurrency` on the stream route (the producer's codes follow from it)."""
    return f"Engine A/B, level {concurrency}, request {index}, seed {seed}."


def stream_wave(
    port: int, texts: Sequence[str], concurrency: int, *, prefix: str, tokens: int, timeout_s: float
) -> list[RequestResult]:
    """Every text streamed from `/v1/audio/speech` as a closed loop of `concurrency`; a reply of other than
    `tokens x 960` samples (the producer's reply length) is a failed request."""
    expected = tokens * SAMPLES_PER_TOKEN

    def send(request: ServedRequest, result: RequestResult, origin: float) -> None:
        result.tokens = tokens
        stream_speech(port, request.text, result, origin, timeout_s=timeout_s)
        if not result.errors and result.samples != expected:
            result.errors.append(f"reply of {result.samples} samples, expected {expected} ({tokens} codes)")

    requests = [ServedRequest(f"{prefix}-{i}", text) for i, text in enumerate(texts)]
    return run_closed_or_poisson(port, requests, concurrency, timeout_s=timeout_s, send=send)


# ---------------------------------------------------------------------------------------------
# Process-tree memory and log errors
# ---------------------------------------------------------------------------------------------


def group_rss_bytes(pgid: int) -> int:
    """The summed resident memory of every process in process group `pgid` (Linux /proc; 0 elsewhere)."""
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    total = 0
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
            if int(fields[2]) == pgid:  # state, ppid, pgrp, ...
                total += int((entry / "statm").read_text().split()[1]) * page
    return total


class RssSampler:
    """Samples `group_rss_bytes(pgid)` every `RSS_PERIOD_S` in a thread; peaks overall and since a mark."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self.peak = 0
        self._window = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"rss-{pgid}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(RSS_PERIOD_S)

    def sample(self) -> int:
        rss = group_rss_bytes(self.pgid)
        self.peak = max(self.peak, rss)
        self._window = max(self._window, rss)
        return rss

    def mark(self) -> None:
        """Start a new window (its peak is `window_peak()`)."""
        self._window = 0
        self.sample()

    def window_peak(self) -> int:
        self.sample()
        return self._window

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: `(Worker pid=12) ERROR 12-03 22:34:13 [file.py:10] ` and the like, before a log line's message.
_PREFIX = re.compile(r"^(?:\([^)]*pid=\d+\)\s*)?(?:(?:ERROR|WARNING|INFO|DEBUG)\s+[\d-]+ [\d:]+ \[[^\]]*\]\s?)?")
_QUIET = re.compile(r"^(?:\([^)]*pid=\d+\)\s*)?(?:WARNING|INFO|DEBUG)\s")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit)\b(?::|$)")


def first_error_line(text: str) -> str | None:
    """The first exception a server log names (`...Error: ...`), colours and log prefixes removed.

    An exception without a message (a bare `AssertionError`) gets the frame that raised it, e.g.
    `AssertionError (s3tokenizer/utils.py:57 in _rename_weights: assert "blocks" in k)`; one whose message
    ends in ":" (`Error(s) in loading state_dict for X:`) gets the line after it.
    """
    frame: tuple[str, str, str] | None = None
    statement = ""
    found: str | None = None
    for raw in text.splitlines():
        clean = _ANSI.sub("", raw)
        if _QUIET.search(clean):  # warnings and info lines quote errors that were handled
            continue
        line = _PREFIX.sub("", clean).rstrip()
        if match := _FRAME.match(line):
            frame, statement = match.groups(), ""
            continue
        stripped = line.strip()
        if found is not None:  # an exception line ending in ":" continues on the next line
            return f"{found} {stripped}"[:400] if stripped else found[:400]
        if frame is not None and not statement and stripped and not set(stripped) <= set("^~ "):
            statement = stripped
        if _ERROR_LINE.match(stripped):
            if ":" not in stripped and frame is not None:
                path = "/".join(Path(frame[0]).parts[-2:])
                stripped += f" ({path}:{frame[1]} in {frame[2]}: {statement})" if statement else ""
            if not stripped.endswith(":"):
                return stripped[:400]
            found = stripped
    return None if found is None else found[:400]


def _log_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


@dataclass
class ArmLevel:
    """One arm at one concurrency level: its requests and the peak RSS of its process tree meanwhile."""

    run: ModeRun
    peak_rss_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        summary = self.run.summary()
        keep = ("requests", "audio_s", "makespan_s", "throughput_audio_s_per_s", "ttfp_s", "rtf", "underruns")
        failed = [r for r in self.run.requests if r.errors]
        return {
            **{k: summary[k] for k in keep},
            "failed": len(failed),
            "first_error": failed[0].errors[0] if failed else None,
            "peak_rss_bytes": self.peak_rss_bytes,
        }


@dataclass
class ArmResult:
    """One arm of one family: how it was served, its status and what it measured."""

    arm: str
    max_num_seqs: int
    max_num_seqs_source: str
    overrides: str  # the value of VLLM_OMNI_TOKEN2WAV_OVERRIDES in its server's environment
    status: str = "not_run"
    reason: str | None = None
    first_error: str | None = None
    ready_after_s: float | None = None
    warm_up_s: float | None = None
    peak_rss_bytes: int | None = None
    log: str | None = None
    levels: dict[int, ArmLevel] = field(default_factory=dict)
    fault: dict[str, Any] | None = None

    @property
    def measured(self) -> bool:
        return self.status in ("ok", "partial")

    def fail(self, status: str, reason: str, log_text: str = "") -> None:
        self.status, self.reason = status, reason
        self.first_error = first_error_line(log_text) or self.first_error

    def to_dict(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "status": self.status,
            "reason": self.reason,
            "first_error": self.first_error,
            "max_num_seqs": self.max_num_seqs,
            "max_num_seqs_source": self.max_num_seqs_source,
            "overrides_env": f"{OVERRIDES_ENV}={self.overrides}",
            "ready_after_s": self.ready_after_s,
            "warm_up_s": self.warm_up_s,
            "peak_rss_bytes": self.peak_rss_bytes,
            "log": self.log,
            "levels": {str(c): level.to_dict() for c, level in sorted(self.levels.items())},
            "fault": self.fault,
        }


@dataclass
class FamilyAB:
    family: str
    model_dir: str | None = None
    arms: dict[str, ArmResult] = field(default_factory=dict)
    order: dict[int, list[str]] = field(default_factory=dict)  # level -> which arm went first
    complete: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The measurements (`report.write_json` adds the comparison and the verdict)."""
        return {
            "family": self.family,
            "model_dir": self.model_dir,
            "complete": self.complete,
            "order": {str(c): o for c, o in self.order.items()},
            "arms": {name: arm.to_dict() for name, arm in self.arms.items()},
        }


@dataclass
class EngineABReport:
    config: EngineABConfig
    command: str = ""
    environment: dict[str, Any] = field(default_factory=dict)
    families: dict[str, FamilyAB] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    complete: bool = False

    def failed(self) -> bool:
        """True when an arm was not measured (did not start, answered nothing) or a measured request failed."""
        return any(
            not arm.measured or arm.status == "partial" for fam in self.families.values() for arm in fam.arms.values()
        )

    def to_dict(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "schema": SCHEMA,
            "benchmark": "engine_ab",
            "complete": self.complete,
            "command": self.command,
            "config": {
                "families": list(cfg.families),
                "concurrency": list(cfg.concurrency),
                "requests": cfg.requests,
                "requests_per_level": {str(c): cfg.requests_at(c) for c in cfg.concurrency},
                "audio_seconds": cfg.audio_seconds,
                "tokens": cfg.tokens,
                "faults": cfg.faults,
                "seed": cfg.seed,
                "plan": cfg.plan,
                "route": cfg.route,
                "full_size": cfg.full_size,
                "endpoint": _endpoint(cfg),
                "voice": "the stage's default voice (the request carries none)",
            },
            "environment": self.environment,
            "families": {name: fam.to_dict() for name, fam in self.families.items()},
            "notes": self.notes,
        }


def _endpoint(cfg: EngineABConfig) -> str:
    if cfg.route == "alone":
        return COMPLETIONS_PATH
    if cfg.route == "stream":
        return SPEECH_PATH
    from vllm_omni_token2wav.benchmarks.engine_ab.pipeline import pipeline_endpoint

    return ", ".join(f"{f}: {pipeline_endpoint(f)}" for f in cfg.families)


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


@dataclass
class _Arm:
    result: ArmResult
    server: EngineServer
    rss: RssSampler | None = None
    family: str = ""


def level_order(index: int) -> list[str]:
    """Which arm goes first at the `index`-th level: alternating, upstream first at the first level."""
    return list(ARMS) if index % 2 == 0 else list(reversed(ARMS))


class EngineABBenchmark:
    """Runs `config` family by family (see the module docstring); `report` fills as it goes."""

    def __init__(
        self,
        config: EngineABConfig,
        stage: Callable[[str], None] | None = None,
        on_update: Callable[[EngineABReport], None] | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.report = EngineABReport(config)
        self._msg = stage or (lambda _text: None)
        self._on_update = on_update or (lambda _report: None)

    def run(self) -> EngineABReport:
        from vllm_omni_token2wav.benchmarks.token2wav_serve.engine import engine_versions

        self.report.environment = {
            "cpu": cpu_model(),
            "usable_cores": usable_cores(),
            "engine": engine_versions(),
            "loadavg_start": load_average(),
            "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        # vLLM configures its log handler on sys.stdout when first imported (the stand-in folders import it):
        # its lines go to stderr, so stdout keeps the table alone.
        with contextlib.redirect_stdout(sys.stderr):
            for family in self.config.families:
                self._family(family)
        self.report.environment["loadavg_end"] = load_average()
        self.report.complete = True
        self._update()
        return self.report

    def _update(self) -> None:
        try:
            self._on_update(self.report)
        except OSError as exc:  # a report that cannot be written now is written at the end
            logger.warning("engine-ab: could not write the partial report: %s", exc)

    # ---- one family --------------------------------------------------------------------------------

    def _family(self, family: str) -> None:
        from vllm_omni_token2wav.model_executor.models.standin.model_dirs import ensure_engine_model_dir

        cfg = self.config
        fam = FamilyAB(family)
        self.report.families[family] = fam
        self._msg(f"{family}: the stand-in engine folder")
        if cfg.route == "pipeline":
            from vllm_omni_token2wav.model_executor.models.standin.toy import TOY_PIPELINES

            model = TOY_PIPELINES[family].ensure_model_dir()
        elif cfg.full_size:
            model = ensure_engine_model_dir(family, reduced=False)
        else:
            model = ensure_engine_model_dir(family, upstream_compatible=family in UPSTREAM_COMPATIBLE)
        fam.model_dir = str(model)
        logs = (cfg.server_logs / family) if cfg.server_logs else Path(tempfile.mkdtemp(prefix=f"engine-ab-{family}-"))
        logs.mkdir(parents=True, exist_ok=True)
        arms = self._arms(family, model, logs)
        fam.arms = {a.result.arm: a.result for a in arms}
        try:
            self._start(arms)
            live = [a for a in arms if a.result.status == "ok"]
            for a in live:
                self._warm_up(a, str(model))
            self._update()
            for index, c in enumerate(cfg.concurrency):
                fam.order[c] = level_order(index)
                for name in fam.order[c]:
                    arm = next(a for a in arms if a.result.arm == name)
                    if arm.result.measured:
                        self._level(arm, str(model), c)
                        self._update()
            for a in arms:
                if a.result.levels and not any(
                    r.samples for level in a.result.levels.values() for r in level.run.requests
                ):
                    a.result.status = "requests_failed"  # measured nothing: the verdict must not compare it
            if cfg.faults:  # validate(): only on route alone
                for a in arms:
                    if a.result.measured:
                        self._fault(a, str(model))
                        self._update()
        finally:
            self._msg(f"{family}: stopping the servers")
            for a in arms:
                if a.rss is not None:
                    a.result.peak_rss_bytes = a.rss.peak or None
                    a.rss.stop()
                if a.result.measured and a.server.alive() is False and a.result.fault is None:
                    a.result.fail("partial", "the server exited during the run", _log_text(a.server.log_path))
                a.server.stop()
            keep = cfg.server_logs is not None or any(not a.result.measured for a in arms)
            for a in arms:
                a.result.log = str(a.server.log_path) if keep else None
            if not keep:
                shutil.rmtree(logs, ignore_errors=True)
        fam.complete = True
        self._update()

    def _arms(self, family: str, model: Path, logs: Path) -> list[_Arm]:
        route, tokens = self.config.route, self.config.tokens
        if route == "pipeline":  # one deployment (upstream's YAML, toy folder) for both arms
            from vllm_omni_token2wav.benchmarks.engine_ab.pipeline import pipeline_deploy, pipeline_max_num_seqs

            seqs, source = pipeline_max_num_seqs(family)
            ours_seqs, ours_source = seqs, source
            upstream_deploy = ours_deploy = pipeline_deploy(family, model, logs, tokens)
        else:
            seqs, source = upstream_max_num_seqs(family)
            ours_seqs = our_max_num_seqs(family, route)
            ours_source = f"deploy/{our_deploy(family, route).name} stage {code2wav_stage_id(route)}"
            upstream_deploy = write_overlay(logs, "deploy_upstream", family, seqs, route, tokens)
            ours_deploy = (
                our_deploy(family)
                if route == "alone"
                else write_overlay(logs, "deploy_ours", family, ours_seqs, route, tokens)
            )
        out = []
        for arm, deploy, overrides, n, where in (
            ("upstream", upstream_deploy, "0", seqs, source),
            ("ours", ours_deploy, "1", ours_seqs, ours_source),
        ):
            server = EngineServer(
                model,
                deploy,
                logs / f"server_{arm}.log",
                env=arm_environment(overrides),
                startup_timeout_s=self.config.startup_timeout_s,
            )
            out.append(_Arm(ArmResult(arm, n, where, overrides), server, family=family))
        return out

    def _start(self, arms: list[_Arm]) -> None:
        """Launch both servers side by side, then wait for each; one that does not come up is recorded."""
        self._msg(f"starting {len(arms)} servers side by side (minutes on a 2-core CPU)")
        start = time.perf_counter()
        for a in arms:
            a.server.launch()
            a.rss = RssSampler(a.server._proc.pid)  # noqa: SLF001 - its process group (start_new_session)
        for a in arms:
            try:
                a.server.wait_ready()
            except EngineServerError as exc:
                a.result.fail("start_failed", str(exc).splitlines()[0], _log_text(a.server.log_path))
                self._msg(f"{a.result.arm}: did not start ({a.result.first_error or a.result.reason})")
                continue
            a.result.status = "ok"
            a.result.ready_after_s = time.perf_counter() - start

    def _warm_up(self, a: _Arm, model: str) -> None:
        """One request (first-call costs land here); an arm that fails it is `requests_failed`."""
        self._msg(f"warming up {a.result.arm}")
        start = time.perf_counter()
        (result,) = self._wave(a, model, 0, [100], 1, "warmup")
        a.result.warm_up_s = time.perf_counter() - start
        if result.errors:
            a.result.fail("requests_failed", "its warm-up request failed", _log_text(a.server.log_path))
            a.result.first_error = a.result.first_error or result.errors[0]
            a.result.reason = f"its warm-up request failed: {result.errors[0]}"

    def _level(self, a: _Arm, model: str, concurrency: int) -> None:
        cfg = self.config
        count = cfg.requests_at(concurrency)
        self._msg(f"c={concurrency} {a.result.arm}: {count} requests")
        assert a.rss is not None
        a.rss.mark()
        run = ModeRun(a.result.arm)
        run.requests = self._wave(a, model, concurrency, range(count), concurrency, f"c{concurrency}")
        ends = [r.deliveries[-1][0] for r in run.requests if r.deliveries]
        run.makespan_s = max(ends, default=0.0) - min((r.arrival_s for r in run.requests), default=0.0)
        a.result.levels[concurrency] = ArmLevel(run, a.rss.window_peak() or None)
        failed = [r for r in run.requests if r.errors]
        if failed and a.result.status == "ok":
            a.result.status = "partial"
            a.result.first_error = a.result.first_error or failed[0].errors[0]
            a.result.reason = f"c={concurrency}: {len(failed)} of {len(run.requests)} requests failed"

    def _wave(
        self, a: _Arm, model: str, level: int, indices: Sequence[int], concurrency: int, prefix: str
    ) -> list[RequestResult]:
        """Requests `indices` of `level` (the same for both arms) through the route's endpoint."""
        cfg = self.config
        if cfg.route == "pipeline":
            from vllm_omni_token2wav.benchmarks.engine_ab.pipeline import pipeline_wave

            texts = [request_text(cfg.seed, level, i) for i in indices]
            return pipeline_wave(
                a.server.port,
                a.family,
                model,
                texts,
                concurrency,
                prefix=prefix,
                tokens=cfg.tokens,
                timeout_s=cfg.request_timeout_s,
            )
        if cfg.route == "stream":
            texts = [request_text(cfg.seed, level, i) for i in indices]
            return stream_wave(
                a.server.port, texts, concurrency, prefix=prefix, tokens=cfg.tokens, timeout_s=cfg.request_timeout_s
            )
        codes = [request_codes(cfg.seed, level, i, cfg.tokens) for i in indices]
        return run_wave(a.server.port, model, codes, concurrency, prefix=prefix, timeout_s=cfg.request_timeout_s)

    def _fault(self, a: _Arm, model: str) -> None:
        """8 requests at once, one with an out-of-range code; then good requests until one succeeds."""
        cfg = self.config
        self._msg(f"fault wave {a.result.arm}: {FAULT_REQUESTS} requests, one with code {BAD_CODE}")
        results = run_wave(
            a.server.port,
            model,
            fault_codes(cfg.seed, cfg.tokens),
            FAULT_REQUESTS,
            prefix="fault",
            timeout_s=cfg.request_timeout_s,
        )
        wave_end = time.perf_counter()
        bad = results[FAULT_INDEX]
        good = [r for i, r in enumerate(results) if i != FAULT_INDEX]
        recovered_after, attempts, last_error = None, 0, None
        deadline = wave_end + cfg.recover_timeout_s
        while time.perf_counter() < deadline and a.server.alive():
            attempts += 1
            codes = [request_codes(cfg.seed, 0, 200 + attempts, cfg.tokens)]
            (probe,) = run_wave(
                a.server.port, model, codes, 1, prefix=f"after{attempts}", timeout_s=cfg.recover_timeout_s
            )
            if not probe.errors:
                recovered_after = time.perf_counter() - wave_end
                break
            last_error = probe.errors[0]
            time.sleep(1.0)
        a.result.fault = {
            "requests": FAULT_REQUESTS,
            "bad_request": {"index": FAULT_INDEX, "code": BAD_CODE, "position": BAD_POSITION},
            "got_audio": sum(1 for r in results if not r.errors and r.samples),
            "good_with_audio": sum(1 for r in good if not r.errors and r.samples),
            "bad_error": bad.errors[0] if bad.errors else None,
            "bad_got_audio": bool(bad.samples and not bad.errors),
            "good_errors": [r.errors[0] for r in good if r.errors][:3],
            "server_alive": a.server.alive(),
            "survived": recovered_after is not None,
            "recover_s": recovered_after,
            "recover_attempts": attempts,
            "recover_last_error": last_error,
            "wave_latency_s": statistics.median([x for r in good if (x := r.ttfp_s()) is not None] or [float("nan")]),
        }


__all__ = [
    "ARMS",
    "FAMILIES",
    "PLANS",
    "PRODUCER_SEQS",
    "ROUTES",
    "SCHEMA",
    "STREAM_FAMILIES",
    "STATUSES",
    "UPSTREAM_DEPLOYS",
    "ArmLevel",
    "ArmResult",
    "EngineABBenchmark",
    "EngineABConfig",
    "EngineABReport",
    "EngineABSetupError",
    "FamilyAB",
    "fault_codes",
    "first_error_line",
    "group_rss_bytes",
    "level_order",
    "post_codes",
    "request_codes",
    "request_text",
    "run_wave",
    "stream_wave",
    "upstream_max_num_seqs",
    "arm_environment",
    "code2wav_stage_id",
    "write_overlay",
]
