#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""vLLM-Omni 0.30's MiniCPM-o code2wav class and ours in the real engine, through the offline API.

`bench engine-ab` cannot measure upstream's `MiniCPMO45Code2Wav` over HTTP: it refuses a request without the
producer metadata its talker stage sends (`request_id`, `chunk_seq`, `last_chunk`: `missing_request_id`), and
`/v1/completions` cannot carry metadata. vLLM-Omni's offline `AsyncOmni` can: a prompt is
`{"prompt_token_ids": codes, "additional_information": {...}}`. This probe serves the `minicpmo_4_5_code2wav`
deployment on the upstream-compatible stand-in folder once per arm, each arm in its own process group
(`VLLM_OMNI_TOKEN2WAV_OVERRIDES=0` plus the `cosyvoice2` shim path for upstream, `=1` for ours), and sends both
the same whole-utterance requests carrying that metadata (each request one chunk: `chunk_seq` 0,
`last_chunk` true): c = 1, 4, 8 closed loop (the codes of `bench engine-ab`), then 8 at once with one
out-of-range code. The arms run one after the other (not interleaved: each is a separate engine), so compare
them with the load averages printed beside them. Prints a table and writes JSON (`--json`).

    PYTHONPATH=$PWD python tools/probe_engine_minicpmo.py --json benchmarks/results/engine_minicpmo_offline_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from vllm_omni_token2wav.benchmarks.common import fmt
from vllm_omni_token2wav.benchmarks.engine_ab.run import (
    FAULT_INDEX,
    FAULT_REQUESTS,
    SAMPLES_PER_TOKEN,
    RssSampler,
    arm_environment,
    fault_codes,
    our_max_num_seqs,
    request_codes,
    upstream_max_num_seqs,
    write_overlay,
)
from vllm_omni_token2wav.benchmarks.token2wav_serve.run import SAMPLE_RATE

REPO = Path(__file__).resolve().parents[1]
FAMILY = "minicpmo_4_5"


def _metadata(request_id: str) -> dict[str, Any]:
    return {"request_id": [request_id], "chunk_seq": [0], "last_chunk": [True]}


async def _one(omni: Any, request_id: str, codes: list[int], origin: float) -> dict[str, Any]:
    result: dict[str, Any] = {"id": request_id, "arrival_s": time.perf_counter() - origin, "samples": 0}
    prompt = {"prompt_token_ids": codes, "additional_information": _metadata(request_id)}
    try:
        async for out in omni.generate(prompt, request_id=request_id):
            output = out.multimodal_output
            tensors = getattr(output, "tensors", output) if output is not None else {}
            audio = tensors.get("audio") if isinstance(tensors, dict) else None
            if audio is not None and getattr(audio, "numel", lambda: 0)() > 0:
                result.setdefault("first_s", time.perf_counter() - origin)
                result["samples"] += int(audio.numel())
        result["end_s"] = time.perf_counter() - origin
    except Exception as exc:  # noqa: BLE001 - a failed request is data
        result["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        result["end_s"] = time.perf_counter() - origin
    return result


async def _wave(omni: Any, prefix: str, codes: list[list[int]], concurrency: int) -> list[dict[str, Any]]:
    slots = asyncio.Semaphore(concurrency)
    origin = time.perf_counter()

    async def gated(i: int, c: list[int]) -> dict[str, Any]:
        async with slots:
            return await _one(omni, f"{prefix}-{i}", c, origin)

    return list(await asyncio.gather(*(gated(i, c) for i, c in enumerate(codes))))


def _level(results: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
    good = [r for r in results if "error" not in r and r["samples"] == tokens * SAMPLES_PER_TOKEN]
    latency = sorted(r["end_s"] - r["arrival_s"] for r in good)
    span = max((r["end_s"] for r in results), default=0.0) - min((r["arrival_s"] for r in results), default=0.0)
    audio_s = sum(r["samples"] for r in good) / SAMPLE_RATE
    return {
        "requests": len(results),
        "failed": len(results) - len(good),
        "first_error": next((r.get("error") for r in results if "error" in r), None),
        "audio_s": audio_s,
        "makespan_s": span,
        "throughput_audio_s_per_s": audio_s / span if span > 0 else None,
        "latency_p50_s": statistics.median(latency) if latency else None,
        "latency_max_s": latency[-1] if latency else None,
    }


def run_arm(args: argparse.Namespace) -> int:
    """Inside the arm's own process: start the engine, run the waves, print one JSON object."""
    from vllm_omni import AsyncOmni

    from vllm_omni_token2wav.deploy import deploy_config
    from vllm_omni_token2wav.model_executor.models.standin.model_dirs import ensure_engine_model_dir
    from vllm_omni_token2wav.plugins import load_plugins

    tokens = round(args.seconds * 25)
    report: dict[str, Any] = {"arm": args.arm, "load_start": os.getloadavg()}
    model = ensure_engine_model_dir(FAMILY, upstream_compatible=True)
    load_plugins()  # our pipelines are registered before AsyncOmni resolves the deployment's

    async def body() -> None:
        # One event loop for the engine's whole life (AsyncOmni binds its output handling to it).
        start = time.perf_counter()
        omni = AsyncOmni(model=str(model), deploy_config=args.deploy or str(deploy_config(f"{FAMILY}_code2wav")))
        report["ready_s"] = time.perf_counter() - start
        try:
            warm = await _wave(omni, "warmup", [request_codes(0, 0, 100, tokens)], 1)
            report["warm_up"] = warm[0]
            report["levels"] = {}
            for c in args.concurrency:
                codes = [request_codes(0, c, i, tokens) for i in range(max(2, c))]
                report["levels"][str(c)] = _level(await _wave(omni, f"c{c}", codes, c), tokens)
            fault = await _wave(omni, "fault", fault_codes(0, tokens), FAULT_REQUESTS)
            after = await _wave(omni, "after", [request_codes(0, 0, 201, tokens)], 1)
            report["fault"] = {
                "got_audio": sum(1 for r in fault if "error" not in r and r["samples"]),
                "bad_error": fault[FAULT_INDEX].get("error"),
                "good_errors": [r["error"] for i, r in enumerate(fault) if i != FAULT_INDEX and "error" in r][:3],
                "next_request_ok": "error" not in after[0] and after[0]["samples"] == tokens * SAMPLES_PER_TOKEN,
                "next_request_error": after[0].get("error"),
            }
        finally:
            report["load_end"] = os.getloadavg()
            omni.shutdown()

    asyncio.run(body())
    print("PROBE-RESULT " + json.dumps(report), flush=True)
    return 0


def drive(args: argparse.Namespace) -> int:
    """Run each arm in its own process group, one after the other; print the table; write the JSON."""
    results: dict[str, Any] = {"command": " ".join(["python", *sys.argv]), "seconds": args.seconds, "arms": {}}
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    seqs, source = upstream_max_num_seqs(FAMILY)
    settings = {
        "upstream": (seqs, source, write_overlay(logs, "deploy_upstream", FAMILY, seqs)),
        "ours": (our_max_num_seqs(FAMILY), f"deploy/{FAMILY}_code2wav.yaml stage 0", None),
    }
    for arm in ("upstream", "ours"):
        env = {**os.environ, **arm_environment("0" if arm == "upstream" else "1")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(REPO)) if p)
        command = [sys.executable, __file__, "--arm", arm, "--seconds", str(args.seconds)]
        command += ["--concurrency", ",".join(map(str, args.concurrency))]
        n, where, deploy = settings[arm]
        command += ["--deploy", str(deploy)] if deploy else []
        log = logs / f"probe_{arm}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        rss = RssSampler(proc.pid)  # its process group (start_new_session): engine core and workers
        code = proc.wait()
        rss.stop()
        line = next((ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("PROBE-RESULT ")), None)
        arm_result = json.loads(line.split(" ", 1)[1]) if line else {"error": f"exit code {code}, no result; {log}"}
        arm_result.update(peak_rss_bytes=rss.peak, max_num_seqs=n, max_num_seqs_source=where)
        results["arms"][arm] = arm_result
    print(render(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
        Path(args.json).with_suffix(".txt").write_text(render(results) + "\n")
    return 0


def _loads(values: Any) -> str:
    return "-" if not values else "/".join(f"{v:.1f}" for v in values)


def render(results: dict[str, Any]) -> str:
    lines = [
        "# MiniCPM-o code2wav alone in the real engine (offline AsyncOmni): vLLM-Omni's class vs ours",
        "",
        f"command: `{results['command']}`; {results['seconds']} s of audio per request; producer metadata in "
        "every request (request_id, chunk_seq 0, last_chunk true); arms run one after the other",
        "",
        "| arm | max_num_seqs | c | requests | failed | audio s/s | latency p50 s | latency max s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, r in results["arms"].items():
        for c, level in (r.get("levels") or {}).items():
            lines.append(
                f"| {arm} | {r.get('max_num_seqs')} | {c} | {level['requests']} | {level['failed']} | "
                f"{fmt(level['throughput_audio_s_per_s'], '.2f')} | {fmt(level['latency_p50_s'], '.2f')} | "
                f"{fmt(level['latency_max_s'], '.2f')} |"
            )
    lines.append("")
    for arm, r in results["arms"].items():
        fault = r.get("fault") or {}
        lines.append(
            f"- {arm}: max_num_seqs from {r.get('max_num_seqs_source')}; ready after {fmt(r.get('ready_s'), '.0f')} s; "
            f"load {_loads(r.get('load_start'))} -> {_loads(r.get('load_end'))}; peak RSS "
            f"{r.get('peak_rss_bytes', 0) / (1 << 20):.0f} MiB; fault wave {fault.get('got_audio')}/{FAULT_REQUESTS} "
            f"got audio, bad request: {fault.get('bad_error')}; next request ok: {fault.get('next_request_ok')}"
            + (f"; error: {r['error']}" if "error" in r else "")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", choices=("upstream", "ours"), help="(internal) run one arm in this process")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8])
    parser.add_argument("--deploy", help=argparse.SUPPRESS)  # (internal) the arm's deploy YAML
    parser.add_argument("--logs", default="/tmp/probe-engine-minicpmo", help="the arms' logs")
    parser.add_argument("--json", help="write the results here (and the table beside it as .txt)")
    args = parser.parse_args(argv)
    return run_arm(args) if args.arm else drive(args)


if __name__ == "__main__":
    sys.exit(main())
