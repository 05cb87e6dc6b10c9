# SPDX-License-Identifier: Apache-2.0
"""One vs two code2wav replicas in one vLLM-Omni deployment, under the same streamed load (see `cli.py`).

Why: vLLM-Omni 0.30 runs `num_replicas` engine processes for a stage and spreads requests over them
round-robin (docs/design/token2wav_stage.md, "Replicas"); this measures what that buys our code2wav stage
and checks, from each replica's own counters, that every chunk of a reply was served by the replica
holding its stream. Each run starts its own engine (`AsyncOmni`, the stand-in stream deployment with
the stage's `num_replicas` set), warms every replica with one request, then keeps `concurrency`
requests in flight until `requests` replies are back. Per run: wall seconds, audio seconds per wall
second, TTFP (submit -> first audio output) p50 / p99, requests per replica, replies whole.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vllm_omni_token2wav import envs
from vllm_omni_token2wav.benchmarks.bench_cli import invoked_command
from vllm_omni_token2wav.benchmarks.common import cpu_model, load_average, publish_json_and_text, usable_cores
from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

FAMILY = "step_audio2"
DEPLOYMENT = "standin_step_audio2_stream"
SAMPLES_PER_CODE = 960  # 24 kHz audio, 25 Hz codes
SAMPLE_RATE = 24000
#: Upstream's Step-Audio2 chunker (`thinker2token2wav_async_chunk`) sends each chunk but the last with the flow's
#: `pre_lookahead_len` (3) codes after it, which the next chunk sends again: a reply of C codes in K chunks
#: reaches the stage as C + 3 (K - 1) tokens.
LOOKAHEAD = 3
STAGE_INIT_TIMEOUT_S = 600
REQUEST_TIMEOUT_S = 600.0
#: The stats file is written at most once a second by `forward` (every write costs the step under CPU
#: contention, `stats.py`); `on_requests_finished` always writes, so the counters are whole at the end.
STATS_INTERVAL_S = "1.0"


@dataclass
class Reply:
    """One request's outcome as the client saw it."""

    request_id: str
    submitted: float
    first_audio: float | None = None
    done: float | None = None
    samples: int = 0
    outputs: int = 0
    error: str | None = None


@dataclass
class RunResult:
    """One deployment's run: the load, what it measured, and what each replica served."""

    replicas: int
    requests: int
    concurrency: int
    codes: int
    wall_s: float = 0.0
    audio_s: float = 0.0
    audio_s_per_s: float = 0.0
    ttfp_p50_s: float | None = None
    ttfp_p99_s: float | None = None
    requests_per_replica: list[int] = field(default_factory=list)
    worker_pids: list[int] = field(default_factory=list)
    whole_replies: int = 0
    #: each replica's seconds inside `forward` calls with work (its counters' `work_forward_s`, warm-up included)
    stage_busy_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    startup_s: float = 0.0


def _overlay(folder: Path, replicas: int, n_timesteps: int | None) -> Path:
    from vllm_omni_token2wav.deploy import deploy_config
    from vllm_omni_token2wav.model_executor.models.standin.toy import write_overlay

    stage: dict[str, Any] = {"num_replicas": replicas}
    if n_timesteps is not None:
        stage["additional_config"] = {"token2wav_n_timesteps": n_timesteps}
    return write_overlay(folder / f"replicas{replicas}.yaml", deploy_config(DEPLOYMENT), {1: stage})


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def _one(omni: Any, rid: str, prompt: list[int], codes: int, reply: Reply) -> None:
    from vllm import SamplingParams

    params = [
        SamplingParams(max_tokens=codes, temperature=0.0, ignore_eos=True, detokenize=False),
        SamplingParams(max_tokens=1, detokenize=False),
    ]
    try:
        async for out in omni.generate({"prompt_token_ids": prompt}, request_id=rid, sampling_params_list=params):
            tensors = getattr(getattr(out, "multimodal_output", None), "tensors", None) or {}
            audio = tensors.get("audio")
            if audio is None:
                continue
            reply.outputs += 1
            reply.samples = int(audio.shape[-1])  # outputs are cumulative: the audio so far
            if reply.first_audio is None and reply.samples:
                reply.first_audio = time.perf_counter()
        reply.done = time.perf_counter()
    except Exception as exc:  # noqa: BLE001 - a failed request is a result of the run
        reply.error = f"{type(exc).__name__}: {exc}"


def _prompt(i: int) -> list[int]:
    return [40 + (7 * i) % 150, 50 + i % 97, 60 + (3 * i) % 89, 70, 80 + i % 71]


async def _load(omni: Any, prefix: str, n: int, concurrency: int, codes: int) -> list[Reply]:
    gate = asyncio.Semaphore(concurrency)
    replies = [Reply(f"{prefix}{i}", 0.0) for i in range(n)]

    async def run(i: int) -> None:
        async with gate:
            replies[i].submitted = time.perf_counter()
            await _one(omni, replies[i].request_id, _prompt(i), codes, replies[i])

    await asyncio.wait_for(asyncio.gather(*(run(i) for i in range(n))), REQUEST_TIMEOUT_S)
    return replies


def _read_counters(pattern: str, replicas: int) -> list[dict[str, Any]]:
    out = []
    for r in range(replicas):
        path = Path(pattern.replace(envs.REPLICA_PLACEHOLDER, str(r)))
        out.append(json.loads(path.read_text()) if path.is_file() else {})
    return out


def judge(reply: Reply, counters: list[dict[str, Any]], codes: int) -> tuple[list[int], str | None]:
    """(the replicas whose stage served `reply`'s request, what is wrong with the reply or None).

    Whole: no error, 960 samples per code, served by exactly one replica, whose counters show every code of it
    served and its last chunk (tokens less the repeated lookahead add up to `codes`; the engine's key is
    `<request id>-<hex>`).
    """
    mine = [
        (r, chunks)
        for r, c in enumerate(counters)
        for key, chunks in c.get("chunks", {}).items()
        if key.startswith(f"{reply.request_id}-")
    ]
    owners = sorted({r for r, _ in mine})
    if reply.error is not None:
        return owners, reply.error
    if reply.samples != SAMPLES_PER_CODE * codes:
        return owners, f"{reply.samples} samples, expected {SAMPLES_PER_CODE * codes}"
    if len(mine) != 1:
        return owners, f"served by replicas {owners}, expected exactly one"
    chunks = mine[0][1]
    served = sum(int(n) for n, _ in chunks) - LOOKAHEAD * (len(chunks) - 1)
    ended = bool(chunks) and bool(chunks[-1][1])
    if served != codes or not ended:
        return owners, f"the stage served {served} codes of it (ended: {ended}), expected {codes} and its last chunk"
    return owners, None


def run_one(replicas: int, args: argparse.Namespace, folder: Path) -> RunResult:
    """Start the deployment with `replicas` code2wav replicas, drive the load, shut it down."""
    from vllm_omni import AsyncOmni

    from vllm_omni_token2wav.model_executor.models.standin.model_dirs import ensure_engine_model_dir
    from vllm_omni_token2wav.plugins import load_plugins

    load_plugins()
    result = RunResult(replicas, args.requests, args.concurrency, args.codes)
    stats = str(folder / f"stats_r{replicas}_{envs.REPLICA_PLACEHOLDER}.json")
    saved = {k: os.environ.get(k) for k in (envs.STAGE_STATS_ENV, envs.STAGE_STATS_INTERVAL_ENV)}
    os.environ[envs.STAGE_STATS_ENV] = stats
    os.environ[envs.STAGE_STATS_INTERVAL_ENV] = STATS_INTERVAL_S
    start = time.perf_counter()
    try:
        omni = AsyncOmni(
            model=str(ensure_engine_model_dir(FAMILY)),
            deploy_config=str(_overlay(folder, replicas, args.n_timesteps)),
            stage_init_timeout=STAGE_INIT_TIMEOUT_S,
        )
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    result.startup_s = time.perf_counter() - start

    async def drive() -> list[Reply]:
        await _load(omni, f"warm{replicas}-", replicas, replicas, args.codes)  # one request per replica
        begin = time.perf_counter()
        replies = await _load(omni, f"rep{replicas}-", args.requests, args.concurrency, args.codes)
        result.wall_s = time.perf_counter() - begin
        return replies

    try:
        replies = asyncio.run(drive())
    finally:
        omni.shutdown()

    counters = _read_counters(stats, replicas)
    result.worker_pids = [int(c.get("pid", -1)) for c in counters]
    result.stage_busy_s = [round(float(c.get("work_forward_s", 0.0)), 2) for c in counters]
    result.requests_per_replica = [0] * replicas
    ttfp = []
    for reply in replies:
        owners, problem = judge(reply, counters, args.codes)
        for r in owners:
            result.requests_per_replica[r] += 1
        if problem is None:
            result.whole_replies += 1
        else:
            result.failures.append(f"{reply.request_id}: {problem}")
        if reply.first_audio is not None:
            ttfp.append(reply.first_audio - reply.submitted)
    for r, c in enumerate(counters):
        if c.get("errors"):
            result.failures.append(f"replica {r}: {c['errors']} segment errors, last {c.get('last_error')}")
    result.audio_s = args.requests * args.codes * SAMPLES_PER_CODE / SAMPLE_RATE
    result.audio_s_per_s = result.audio_s / result.wall_s if result.wall_s else 0.0
    result.ttfp_p50_s = statistics.median(ttfp) if ttfp else None
    result.ttfp_p99_s = _percentile(ttfp, 0.99)
    return result


def render(document: dict[str, Any]) -> str:
    runs = document["runs"]
    lines = [
        f"code2wav replicas: {document['deployment']} ({FAMILY} stand-in), {runs[0]['requests']} streamed replies "
        f"of {runs[0]['codes']} codes at c={runs[0]['concurrency']}, n_timesteps {document['n_timesteps']}",
        f"command: {document['command']}",
        f"host: {document['environment']['cpu']}, {document['environment']['cores']} usable cores, "
        f"load {document['environment']['load_average']}",
        "replicas  audio s/s  wall s  TTFP p50 s  TTFP p99 s  requests/replica  whole  stage busy s  pids",
    ]
    for run in runs:
        p50 = "-" if run["ttfp_p50_s"] is None else f"{run['ttfp_p50_s']:.2f}"
        p99 = "-" if run["ttfp_p99_s"] is None else f"{run['ttfp_p99_s']:.2f}"
        lines.append(
            f"{run['replicas']:>8}  {run['audio_s_per_s']:>9.2f}  {run['wall_s']:>6.1f}  {p50:>10}  {p99:>10}  "
            f"{'/'.join(map(str, run['requests_per_replica'])):>16}  {run['whole_replies']:>2}/{run['requests']:<2}  "
            f"{'/'.join(f'{b:.1f}' for b in run['stage_busy_s']):>12}  {','.join(map(str, run['worker_pids']))}"
        )
    if len(runs) > 1 and runs[0]["audio_s_per_s"]:
        ratio = runs[-1]["audio_s_per_s"] / runs[0]["audio_s_per_s"]
        lines.append(f"audio s/s {runs[-1]['replicas']} vs {runs[0]['replicas']} replicas: x{ratio:.2f}")
    lines.append(
        "stage busy s: each replica's seconds inside forward calls with work (warm-up included); wall s: the "
        "measured load only"
    )
    for run in runs:
        lines += [f"replicas {run['replicas']}: {failure}" for failure in run["failures"]]
    return "\n".join(lines) + "\n"


def execute(args: argparse.Namespace, replica_counts: tuple[int, ...]) -> int:
    # vLLM logs to stdout by default; the table is stdout (`benchmarks/record.py` keeps it as the .txt)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[2]))  # engine processes: this checkout
    with tempfile.TemporaryDirectory(prefix="code2wav_replicas_") as tmp:
        runs = []
        for replicas in replica_counts:
            logger.info("code2wav replicas: starting the deployment with %d replica(s)", replicas)
            runs.append(asdict(run_one(replicas, args, Path(tmp))))
    document = {
        "benchmark": "code2wav_replicas",
        "command": invoked_command(),
        "deployment": DEPLOYMENT,
        "n_timesteps": args.n_timesteps or 10,
        "environment": {"cpu": cpu_model(), "cores": usable_cores(), "load_average": load_average()},
        "runs": runs,
    }
    text = render(document)
    publish_json_and_text(document, text, args.json)
    return 1 if any(run["failures"] for run in runs) else 0
