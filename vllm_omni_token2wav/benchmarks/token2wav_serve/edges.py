# SPDX-License-Identifier: Apache-2.0
"""`bench token2wav-serve --engine --edge shm,mooncake`: the code2wav edge on SharedMemory vs Mooncake TE.

A deployment that puts the code2wav stage on another node moves the stage-0 -> stage-1 edge from vLLM-Omni's
`SharedMemoryConnector` (one host) to `MooncakeTransferEngineConnector` (TCP or RDMA; docs/design/multinode.md).
What does that cost a streamed reply? This runs the same served stack (`deploy/standin_step_audio2_stream.yaml`:
the stand-in producer feeding our Step-Audio2 code2wav through vLLM-Omni's async chunks, one engine) once per
edge, one server at a time (deploy overlay: the reply length and, for `mooncake`, the YAML `connectors:` entry on
the edge, TCP on 127.0.0.1), warms it up, and streams `requests` speech requests per concurrency level (closed
loop). Per edge and level:

- **TTFP** p50 / p99 and **throughput** (audio seconds per wall second) from the listener's side (the emulated
  benchmark's `RequestResult`), failures and short replies;
- **per-chunk transfer time**: neither connector reports one, so the server runs with `transfer_site/` first on
  its `PYTHONPATH` (its `sitecustomize` times every connector `put` and every `get` that returned data, in
  every engine process); per chunk key: the put (serialise + store / pool write), the get (fetch +
  deserialise; for Mooncake the TCP read), their sum (**transfer**) and the **hand-off** (put start to get end,
  across the two processes: the transfer plus the receiver's polling wait), and the receiver's polls that found
  nothing yet (**misses**: how many, and the time its scheduler spent in them; for Mooncake each is a ZMQ
  round trip to the sender, for SharedMemory a file lookup);
- **server CPU**: the CPU seconds of the server's process tree (API server, engine cores, workers, all their
  threads) per level and per audio second, and its idle draw (cores busy over `IDLE_S` with no request) after
  the warm-up: what the edge's machinery costs the stages on a shared host.

The verdict compares the Mooncake edge with the targets of issue 35 at the largest level: transfer p50
<= `TRANSFER_TARGET_MS` and TTFP p50 within `TTFP_TARGET` of SharedMemory's. The report (`EdgeReport`) is filled as
the run goes; `edges_report.py` renders it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from vllm_omni_token2wav.benchmarks.common import load_average, stamp_load_at_end
from vllm_omni_token2wav.benchmarks.engine_server import EngineServer, free_port
from vllm_omni_token2wav.benchmarks.speech_stream_client import ServedRequest, run_closed_or_poisson
from vllm_omni_token2wav.benchmarks.token2wav_serve.engine import (
    environment_with_engine,
    served_standin,
    shipped_deploy,
    warm_up_server,
)
from vllm_omni_token2wav.benchmarks.token2wav_serve.run import SAMPLE_RATE, TOKEN_RATE, RequestResult, percentiles
from vllm_omni_token2wav.benchmarks.token2wav_serve.soak import process_tree

SCHEMA: Final = "vllm-omni/bench-token2wav-serve-edges/1"
EDGES: Final = ("shm", "mooncake")
TRANSFERS_ENV: Final = "VLLM_OMNI_TOKEN2WAV_BENCH_TRANSFERS"  # transfer_site/sitecustomize.py
SITE: Final = Path(__file__).resolve().parent / "transfer_site"
CONNECTOR_NAME: Final = "connector_of_mooncake"
TRANSFER_TARGET_MS: Final = 5.0
TTFP_TARGET: Final = 0.15
IDLE_S: Final = 3.0  # the server idle after its warm-up: what its processes burn with no request


def tree_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of `pid` and its descendants (Linux `/proc/<pid>/stat`), all their threads."""
    if pid is None:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in process_tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / tick


class EdgeSetupError(Exception):
    """An input of the edge comparison cannot be used (the message says which)."""


@dataclass(frozen=True)
class EdgeConfig:
    """What to serve. Defaults: both edges, c = 1, 4, 8, 2 x c requests (>= 4) per level, 2 s replies."""

    edges: tuple[str, ...] = EDGES
    concurrency: tuple[int, ...] = (1, 4, 8)
    requests: int | None = None  # per level; None: max(4, 2 x c)
    audio_seconds: float = 2.0
    seed: int = 0
    plan: str = "edges"
    startup_timeout_s: float = 900.0
    request_timeout_s: float = 600.0
    server_logs: Path | None = None

    def validate(self) -> None:
        unknown = [e for e in self.edges if e not in EDGES]
        if not self.edges or unknown or len(set(self.edges)) != len(self.edges):
            raise ValueError(f"edges {','.join(self.edges)!r}: expected distinct names of {', '.join(EDGES)}")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError(f"concurrency levels must be >= 1, got {self.concurrency}")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")
        if not 0.2 <= self.audio_seconds <= 120:
            raise ValueError(f"audio_seconds must be in [0.2, 120], got {self.audio_seconds}")

    @property
    def tokens(self) -> int:
        return max(1, round(self.audio_seconds * TOKEN_RATE))

    def requests_at(self, concurrency: int) -> int:
        return self.requests if self.requests is not None else max(4, 2 * concurrency)


#: Sizes by plan (explicit options win). `edges-smoke`: c = 1, 2 short requests per edge (the CI test).
PLANS: Final[dict[str, dict[str, Any]]] = {
    "edges": {},
    "edges-smoke": {"concurrency": (1,), "requests": 2, "audio_seconds": 1.2},
}


def parse_edges(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def missing_mooncake() -> str | None:
    """What the Mooncake edge lacks here (the `multinode` extra), or None."""
    if importlib.util.find_spec("mooncake") is None:
        return 'mooncake-transfer-engine-non-cuda (the `multinode` extra: pip install "vllm-omni-token2wav[multinode]")'
    return None


def mooncake_connector(zmq_port: int) -> dict[str, Any]:
    """The deploy YAML's top-level `connectors:` entry of the edge: Mooncake TE over TCP on loopback, with the
    shipped SharedMemory edge's chunk keys and polling waits (README, "Running the code2wav stage on its own node")."""
    return {
        CONNECTOR_NAME: {
            "name": "MooncakeTransferEngineConnector",
            "extra": {
                "host": "127.0.0.1",
                "protocol": "tcp",
                "zmq_port": zmq_port,
                "memory_pool_size": 64 * 1024 * 1024,
                "connector_get_sleep_s": 0.01,
                "connector_get_max_wait_first_chunk": 3000,
                "connector_get_max_wait": 300,
                "codec_chunk_frames": 25,
                "codec_left_context_frames": 3,
            },
        }
    }


def edge_overlay(folder: Path, edge: str, tokens: int) -> Path:
    """A deploy overlay on the shipped stand-in stream YAML: the reply length, and for `mooncake` the edge."""
    from vllm_omni_token2wav.model_executor.models.standin import toy

    stages: dict[int, dict[str, Any]] = {0: {"default_sampling_params": {"max_tokens": tokens}}}
    top: dict[str, Any] | None = None
    if edge == "mooncake":
        stages[0]["output_connectors"] = {"to_stage_1": CONNECTOR_NAME}
        stages[1] = {"input_connectors": {"from_stage_0": CONNECTOR_NAME}}
        top = {"connectors": mooncake_connector(free_port())}
    return toy.write_overlay(folder / f"edge_{edge}.yaml", shipped_deploy(), stages, top=top)


def read_transfers(folder: Path) -> list[dict[str, Any]]:
    """Every line `transfer_site/sitecustomize.py` wrote, with the writing process's pid."""
    out = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                out.append({**json.loads(line), "pid": int(path.stem)})
    return out


def transfer_summary(lines: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per chunk key put by one process and got by another: put / get / transfer (put + get) / hand-off (put start
    to get end) ms percentiles, chunks, bytes per chunk, and the connector classes seen."""
    puts = {r["key"]: r for r in lines if r["op"] == "put" and r.get("ok", True)}
    gets = {r["key"]: r for r in lines if r["op"] == "get"}
    keys = [k for k in puts if k in gets]
    misses = [r["ms"] for r in lines if r["op"] == "miss"]
    sizes = [puts[k]["bytes"] for k in keys if puts[k].get("bytes")]
    return {
        "chunks": len(keys),
        "puts": len(puts),
        "gets": len(gets),
        "cross_process": sum(1 for k in keys if puts[k]["pid"] != gets[k]["pid"]),
        "connectors": sorted({r["connector"] for r in lines}),
        "bytes_per_chunk_mean": sum(sizes) / len(sizes) if sizes else None,
        "put_ms": percentiles([puts[k]["ms"] for k in keys]),
        "get_ms": percentiles([gets[k]["ms"] for k in keys]),
        "transfer_ms": percentiles([puts[k]["ms"] + gets[k]["ms"] for k in keys]),
        "handoff_ms": percentiles([1e3 * (gets[k]["end"] - puts[k]["start"]) for k in keys]),
        "misses": len(misses),
        "miss_ms": percentiles(misses),
        "miss_ms_total": sum(misses),
    }


@dataclass
class EdgeLevel:
    """One edge at one concurrency level: the listener's results and the transfers in its window."""

    edge: str
    concurrency: int
    wall_s: float
    expected_samples: int
    results: list[RequestResult]
    transfers: dict[str, Any]
    cpu_s: float | None = None  # the server tree's CPU seconds during the level

    def failures(self) -> list[str]:
        out = [f"{r.request_id}: {r.errors[0]}" for r in self.results if r.errors]
        out += [
            f"{r.request_id}: {r.samples} samples, expected {self.expected_samples}"
            for r in self.results
            if not r.errors and r.samples != self.expected_samples
        ]
        return out

    def summary(self) -> dict[str, Any]:
        ttfp = [t for r in self.results if (t := r.ttfp_s()) is not None]
        audio = sum(r.audio_s for r in self.results)
        return {
            "edge": self.edge,
            "concurrency": self.concurrency,
            "requests": len(self.results),
            "failures": self.failures(),
            "wall_s": self.wall_s,
            "audio_s": audio,
            "throughput_audio_s_per_s": audio / self.wall_s if self.wall_s > 0 else None,
            "ttfp_s": percentiles(ttfp),
            "transfers": self.transfers,
            "server_cpu_s": self.cpu_s,
            "server_cpu_s_per_audio_s": self.cpu_s / audio if self.cpu_s is not None and audio > 0 else None,
        }


@dataclass
class EdgeReport:
    """The edge comparison as it goes; `to_dict()` is the JSON document."""

    config: EdgeConfig
    environment: dict[str, Any] = field(default_factory=dict)
    model: dict[str, str] = field(default_factory=dict)
    command: str = ""
    levels: list[EdgeLevel] = field(default_factory=list)
    startup_s: dict[str, float] = field(default_factory=dict)
    idle_cores: dict[str, float] = field(default_factory=dict)  # per edge: server CPU s per wall s, no requests
    notes: list[str] = field(default_factory=list)
    complete: bool = False

    def failed(self) -> bool:
        return any(level.failures() for level in self.levels) or not self.complete

    def level(self, edge: str, concurrency: int) -> EdgeLevel | None:
        return next((lv for lv in self.levels if lv.edge == edge and lv.concurrency == concurrency), None)

    def targets(self) -> dict[str, Any] | None:
        """The Mooncake edge against issue 35's targets at the largest level measured on both edges."""
        both = [c for c in self.config.concurrency if self.level("shm", c) and self.level("mooncake", c)]
        if not both:
            return None
        c = max(both)
        shm, mooncake = self.level("shm", c).summary(), self.level("mooncake", c).summary()  # type: ignore[union-attr]
        transfer = mooncake["transfers"]["transfer_ms"]["p50"]
        ttfp_shm, ttfp_mc = shm["ttfp_s"]["p50"], mooncake["ttfp_s"]["p50"]
        ratio = ttfp_mc / ttfp_shm if ttfp_shm and ttfp_mc is not None else None
        return {
            "concurrency": c,
            "transfer_p50_ms": transfer,
            "transfer_target_ms": TRANSFER_TARGET_MS,
            "transfer_met": transfer is not None and transfer <= TRANSFER_TARGET_MS,
            "ttfp_p50_ratio": ratio,
            "ttfp_target_ratio": 1.0 + TTFP_TARGET,
            "ttfp_met": ratio is not None and ratio <= 1.0 + TTFP_TARGET,
        }

    def to_dict(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "schema": SCHEMA,
            "command": self.command,
            "complete": self.complete,
            "config": {
                "edges": list(cfg.edges),
                "concurrency": list(cfg.concurrency),
                "requests": {c: cfg.requests_at(c) for c in cfg.concurrency},
                "audio_seconds": cfg.audio_seconds,
                "tokens": cfg.tokens,
                "seed": cfg.seed,
                "plan": cfg.plan,
            },
            "environment": self.environment,
            "model": self.model,
            "startup_s": self.startup_s,
            "idle_cores": self.idle_cores,
            "levels": [lv.summary() for lv in self.levels],
            "targets": self.targets(),
            "notes": self.notes,
        }


class EdgeBenchmark:
    """Serve each edge in turn (one server alive at a time) and stream every level through it."""

    def __init__(self, config: EdgeConfig, stage: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.report = EdgeReport(config)
        self._stage = stage or (lambda _msg: None)

    def run(self) -> EdgeReport:
        if "mooncake" in self.config.edges and (missing := missing_mooncake()):
            raise EdgeSetupError(f"the mooncake edge needs {missing}")
        with stamp_load_at_end(lambda: self.report.environment):
            self.report.environment = environment_with_engine()
            self.report.environment["loadavg_start"] = load_average()
            standin = served_standin(self.config.seed, self.config.server_logs, "token2wav-edges-")
            self.report.model = {**standin.model, "transport": "one engine, loopback"}
            for edge in self.config.edges:
                self._serve_edge(edge, standin.model_dir, standin.logs)
            self.report.complete = True
        if not standin.keep_logs and not self.report.failed():
            shutil.rmtree(standin.logs, ignore_errors=True)
        else:
            self.report.notes.append(f"server logs: {standin.logs}")
        return self.report

    def _serve_edge(self, edge: str, model_dir: Path, logs: Path) -> None:
        cfg = self.config
        transfers = logs / f"{edge}_transfers"
        shutil.rmtree(transfers, ignore_errors=True)
        transfers.mkdir(parents=True)
        path = os.pathsep.join(p for p in (str(SITE), os.environ.get("PYTHONPATH", "")) if p)
        server = EngineServer(
            model_dir,
            edge_overlay(logs, edge, cfg.tokens),
            logs / f"server_{edge}.log",
            env={"PYTHONPATH": path, TRANSFERS_ENV: str(transfers)},
            startup_timeout_s=cfg.startup_timeout_s,
        )
        self._stage(f"{edge}: starting the server (log {server.log_path})")
        started = time.monotonic()
        try:
            server.start()
            self.report.startup_s[edge] = time.monotonic() - started
            self._stage(f"{edge}: ready in {self.report.startup_s[edge]:.0f} s; warming up")
            warm_up_server(server.port, cfg.tokens, cfg.request_timeout_s, f"the {edge} server")
            before = tree_cpu_s(server.pid)
            time.sleep(IDLE_S)
            after = tree_cpu_s(server.pid)
            if before is not None and after is not None:
                self.report.idle_cores[edge] = (after - before) / IDLE_S
            for c in cfg.concurrency:
                self.report.levels.append(self._level(edge, server, c, transfers))
        finally:
            server.stop()

    def _level(self, edge: str, server: EngineServer, c: int, transfers: Path) -> EdgeLevel:
        cfg = self.config
        count = cfg.requests_at(c)
        requests = [
            ServedRequest(f"{edge}-c{c}-{i}", f"Edge benchmark, level {c}, request {i}, seed {cfg.seed}.")
            for i in range(count)
        ]
        self._stage(f"{edge}: c={c}, {count} requests")
        begin = time.time()
        cpu_before = tree_cpu_s(server.pid)
        started = time.perf_counter()
        results = run_closed_or_poisson(server.port, requests, c, timeout_s=cfg.request_timeout_s)
        wall = time.perf_counter() - started
        cpu_after = tree_cpu_s(server.pid)
        cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
        time.sleep(0.2)  # the last get's line is written after the reply's last chunk left the stage
        window = [r for r in read_transfers(transfers) if r["start"] >= begin]
        expected = cfg.tokens * SAMPLE_RATE // TOKEN_RATE
        return EdgeLevel(edge, c, wall, expected, results, transfer_summary(window), cpu)


__all__ = [
    "EDGES",
    "PLANS",
    "EdgeBenchmark",
    "EdgeConfig",
    "EdgeLevel",
    "EdgeReport",
    "EdgeSetupError",
    "edge_overlay",
    "missing_mooncake",
    "mooncake_connector",
    "parse_edges",
    "read_transfers",
    "transfer_summary",
]
