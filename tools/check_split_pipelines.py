#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Upstream's own pipelines at toy size, split: the code2wav stage on a headless node behind the head's HTTP API.

Issue 35 item 1 asks whether vLLM-Omni 0.30's split deployment works with this plugin's code2wav stage behind
upstream's own thinker/talker stages, not only behind the stand-in producer
(`tests/entrypoints/cli/test_serve_split_node.py`). For each family's toy pipeline
(`vllm_omni_token2wav/model_executor/models/standin/toy/`: upstream's deploy YAML as an overlay, the async-chunk
variant, SharedMemory edges) this script starts, one deployment at a time:

- the head: `vllm-omni-token2wav serve <toy> --deploy-config <overlay> --stage-id 0 -oma 127.0.0.1 -omp P
  --host 127.0.0.1 --port H` (the HTTP API, the orchestrator, stage 0);
- any other thinker/talker stage (MiniCPM-o's talker, stage 1) as `--stage-id N --headless` in the head's
  folder and environment (the head runs exactly one stage in 0.30: every other one is "remote");
- the code2wav stage as `--stage-id C --headless` in its own process group, working folder and environment (the
  node's alone carries the stage's counters file, `VLLM_OMNI_TOKEN2WAV_STAGE_STATS`),

then sends one whole and one streamed request through the head as the served tests do
(`tests/e2e/test_upstream_pipelines_served.py`, the CosyVoice3 served test) and checks that each reply is 24 kHz
audio of the expected length: Step-Audio2 the pinned codes x 960 samples, CosyVoice3 the request's
`max_new_tokens` x 960 (the toy's: 2 codes per text byte, upstream's floor), MiniCPM-o the codes the code2wav
node voiced for it (its counters) x 960. Each reply is also compared with our stage alone in this process on
the chunks upstream's async-chunk function handed the node, recorded in the head's processes by the toy recorders
(`vllm_omni_token2wav/model_executor/models/standin/toy/recorder.py`; CosyVoice3's with the talker's
conditioning tensors: `vllm_omni_token2wav/model_executor/models/standin/toy/cosyvoice3_door.py`), with the noise
seed the node's stage used (its counters), as `tests/e2e/test_upstream_pipelines.py` and the split-node test do:
equal to one 16-bit PCM step (`--no-reference` skips it). It prints a table family x whole/streamed x
works/fails (with the reason), kills every process group it started, and exits non-zero if anything failed.
The reference needs the repository root on `PYTHONPATH` (`tests/e2e/references.py`).

    PYTHONPATH=$PWD /work/main/.venv/bin/python tools/check_split_pipelines.py [--families step_audio2,...]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import io
import json
import os
import sys
import tempfile
import time
import wave
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tests.helpers.serve_process import ServeProcess

FAMILIES = ("step_audio2", "minicpmo_4_5", "cosyvoice3")
SAMPLE_RATE = 24000
SAMPLES_PER_CODE = 960  # 24 kHz audio, 25 Hz codes
#: MiniCPM-o's chunks after the first repeat 3 context codes (`tts2code2wav_async_chunk`).
MINICPMO_CONTEXT_CODES = 3
#: One 16-bit PCM step (the served audio is int16) plus float rounding.
PCM_TOLERANCE = 1.5 / 32768


@dataclass
class Outcome:
    """One request's row of the table."""

    family: str
    mode: str
    ok: bool
    detail: str
    #: the reply's audio (float32 in [-1, 1]) and its request's key in the node's counters, for the reference
    audio: np.ndarray | None = None
    key: str | None = None


@dataclass
class Deployment:
    """The processes of one family's split deployment and what its requests gave."""

    family: str
    procs: list[ServeProcess]
    port: int
    model: Path
    stats: Path
    records: Path
    started_s: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)

    def kill(self) -> None:
        for proc in reversed(self.procs):  # nodes first, the head last
            proc.kill()


def _free_port() -> int:
    from vllm_omni_token2wav.benchmarks.engine_server import free_port

    return free_port()


def _health(port: int) -> int:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/health")
        status = conn.getresponse().status
        conn.close()
        return int(status)
    except (OSError, http.client.HTTPException):
        return 0


def _post(port: int, path: str, body: Mapping[str, Any], timeout_s: float) -> tuple[int, list[bytes]]:
    """POST JSON; (status, the body's reads as they arrived)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        reads = []
        while piece := reply.read1(1 << 16):
            reads.append(piece)
        return int(reply.status), reads
    finally:
        conn.close()


def _wav(data: bytes) -> tuple[int, int, int, int]:
    with wave.open(io.BytesIO(data)) as w:
        return w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()


def _voiced(stats: Path, family: str) -> dict[str, int]:
    """request key -> codes the code2wav node voiced (its counters file)."""
    if not stats.is_file():
        return {}
    raw = json.loads(stats.read_text())
    out = {}
    for key, chunks in raw.get("chunks", {}).items():
        context = MINICPMO_CONTEXT_CODES * (len(chunks) - 1) if family == "minicpmo_4_5" else 0
        out[key] = sum(int(n) for n, _ in chunks) - context
    return out


def _error(status: int, data: bytes) -> str:
    return f"HTTP {status}: {' '.join(data[:300].decode(errors='replace').split())}"


def start(family: str, folder: Path, tokens: int, startup_timeout_s: float) -> Deployment:
    """Start the head, any other AR stage and the code2wav node; return once `/health` answers 200."""
    from vllm_omni_token2wav import envs
    from vllm_omni_token2wav.benchmarks.engine_ab.pipeline import reply_overrides
    from vllm_omni_token2wav.model_executor.models.standin.toy import TOY_PIPELINES, site_pythonpath
    from vllm_omni_token2wav.model_executor.models.standin.toy.recorder import RECORD_ENV

    pipeline: Any = TOY_PIPELINES[family]
    model = pipeline.ensure_model_dir()
    overrides = reply_overrides(family, tokens) if family != "cosyvoice3" else None
    deploy = pipeline.deployment(model, folder, async_chunk=True, stage_overrides=overrides)
    master, http_port = _free_port(), _free_port()
    common = [str(model), "--deploy-config", str(deploy), "-oma", "127.0.0.1", "-omp", str(master)]
    base = {k: v for k, v in os.environ.items() if k != envs.STAGE_STATS_ENV}
    if family == "cosyvoice3":  # the toy's stand-in speech tokenizer door, in every process (the talker's)
        base = pipeline.engine_env(base=base)
    stats = folder / "node" / "stage_stats.json"
    records = folder / "chunks"
    records.mkdir(parents=True, exist_ok=True)
    # the head's processes (the producing stages) record what upstream's async-chunk function hands the node
    head_env = {**base, "PYTHONPATH": site_pythonpath(base.get("PYTHONPATH")), RECORD_ENV: str(records)}
    if family == "cosyvoice3":  # its producer is recorded by the CosyVoice3 door (conditioning tensors kept)
        head_env = pipeline.engine_env(records, base=head_env)
    code2wav = int(pipeline.code2wav_stage)
    procs = [
        ServeProcess(
            [*common, "--stage-id", "0", "--host", "127.0.0.1", "--port", str(http_port)],
            folder / "head",
            dict(head_env),
            folder / "head.log",
            name="head",
        )
    ]
    for sid in pipeline.ar_stages:
        if sid != 0:
            procs.append(
                ServeProcess(
                    [*common, "--stage-id", str(sid), "--headless"],
                    folder / "head",
                    dict(head_env),
                    folder / f"stage{sid}.log",
                    name=f"stage{sid}",
                )
            )
    procs.append(
        ServeProcess(
            [*common, "--stage-id", str(code2wav), "--headless"],
            folder / "node",
            {**base, envs.STAGE_STATS_ENV: str(stats)},
            folder / "node.log",
            name="node",
        )
    )
    deployment = Deployment(family, procs, http_port, model, stats, records)
    began = time.monotonic()
    try:
        for proc in procs:
            proc.start()
        deadline = began + startup_timeout_s
        while time.monotonic() < deadline:
            for proc in procs:
                if not proc.alive():
                    raise RuntimeError(
                        f"{proc.name} exited before the deployment was ready ({proc.log}):\n{proc.tail()}"
                    )
            if _health(http_port) == 200:
                deployment.started_s = time.monotonic() - began
                return deployment
            time.sleep(2.0)
    except BaseException:  # Ctrl-C included: nothing started here outlives the script
        deployment.kill()
        raise
    deployment.kill()
    raise RuntimeError(f"not ready after {startup_timeout_s:.0f} s; logs in {folder}:\n{procs[0].tail()}")


def _request(family: str, model: Path, stream: bool, tokens: int) -> tuple[str, dict[str, Any], int | None]:
    """(path, body, expected samples or None where the node's counters decide) as the served tests send it."""
    text = "Split streamed, please." if stream else "Split whole reply."
    if family == "step_audio2":
        body: dict[str, Any] = {"model": str(model), "input": text, "response_format": "pcm" if stream else "wav"}
        if stream:
            body |= {"stream": True, "stream_format": "audio"}
        return "/v1/audio/speech", body, tokens * SAMPLES_PER_CODE
    if family == "minicpmo_4_5":
        chat = {"messages": [{"role": "user", "content": text}], "modalities": ["text", "audio"], "stream": stream}
        return "/v1/chat/completions", {"model": str(model), **chat}, None
    from vllm_omni_token2wav.model_executor.models.standin.toy.cosyvoice3 import PIPELINE

    # upstream's speech adapter floors the talker at 2 codes per text token (`min_tokens`) and lets `max_new_tokens`
    # cap it: the toy's default `max_new_tokens` is that floor, so the reply is exactly that long (a larger cap
    # lets the random talker stop anywhere between)
    path, body = PIPELINE.http_request(text, stream=stream)
    return path, {"model": str(model), **body}, int(body["max_new_tokens"]) * SAMPLES_PER_CODE


def _pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def _wav_audio(data: bytes) -> np.ndarray:
    rate, channels, width, _ = _wav(data)
    if (rate, channels, width) != (SAMPLE_RATE, 1, 2):
        raise ValueError(f"WAV {rate} Hz, {channels} ch, {width} B: expected {SAMPLE_RATE} Hz mono 16-bit")
    with wave.open(io.BytesIO(data)) as w:
        return _pcm(w.readframes(w.getnframes()))


def _audio(family: str, stream: bool, reads: list[bytes]) -> tuple[np.ndarray, str]:
    """(the reply's audio, a note); raises ValueError where the reply carries no 24 kHz mono 16-bit audio."""
    data = b"".join(reads)
    if family != "minicpmo_4_5":
        if not stream:
            return _wav_audio(data), "WAV"
        if len(reads) < 2:
            raise ValueError(f"one read only ({len(data)} bytes): not streamed")
        return _pcm(data), f"{len(reads)} reads"
    wavs: list[bytes] = []
    if stream:
        for line in data.split(b"\n"):
            if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                for choice in json.loads(line[5:]).get("choices", []):
                    content = (choice.get("delta") or {}).get("content")
                    if isinstance(content, str) and content.startswith("UklGR"):  # base64 of "RIFF"
                        wavs.append(base64.b64decode(content))
    else:
        choices = json.loads(data)["choices"]
        if not any(c["message"].get("content") for c in choices):
            raise ValueError("no text in the reply")
        wavs = [base64.b64decode(c["message"]["audio"]["data"]) for c in choices if c["message"].get("audio")]
    if not wavs:
        raise ValueError("no audio in the reply")
    if stream and len(wavs) < 2:
        raise ValueError("one audio delta only: not streamed")
    return np.concatenate([_wav_audio(w) for w in wavs]), f"{len(wavs)} WAV{'s' if len(wavs) > 1 else ''}"


def _new_key(before: Mapping[str, Any], after: Mapping[str, Any]) -> str | None:
    new = [k for k in after if k not in before]
    return new[0] if len(new) == 1 else None


def check(deployment: Deployment, tokens: int, timeout_s: float) -> None:
    """One whole, then one streamed request; each outcome appended to `deployment.outcomes`."""
    family = deployment.family
    for stream in (False, True):
        mode = "streamed" if stream else "whole"
        path, body, expected = _request(family, deployment.model, stream, tokens)
        before = _voiced(deployment.stats, family)
        began = time.monotonic()
        try:
            status, reads = _post(deployment.port, path, body, timeout_s)
        except (OSError, http.client.HTTPException) as exc:
            deployment.outcomes.append(Outcome(family, mode, False, f"{type(exc).__name__}: {exc}"))
            continue
        took = time.monotonic() - began
        if status != 200:
            deployment.outcomes.append(Outcome(family, mode, False, _error(status, b"".join(reads))))
            continue
        try:
            audio, note = _audio(family, stream, reads)
        except (ValueError, KeyError, json.JSONDecodeError, wave.Error, EOFError) as exc:
            deployment.outcomes.append(Outcome(family, mode, False, f"{type(exc).__name__}: {exc}"))
            continue
        voiced = _voiced(deployment.stats, family)
        key = _new_key(before, voiced)
        if expected is None:  # MiniCPM-o: the codes the node voiced for this request
            if key is None:
                deployment.outcomes.append(Outcome(family, mode, False, "node counters: not one new request"))
                continue
            expected = voiced[key] * SAMPLES_PER_CODE
        samples = int(audio.shape[0])
        ok = samples == expected and samples > 0 and bool(np.abs(audio).max() > 0)
        detail = f"{samples} samples ({note}), expected {expected}, {took:.1f} s"
        deployment.outcomes.append(Outcome(family, mode, ok, detail, audio, key))


def _recorded_chunks(family: str, folder: Path) -> dict[str, list[Any]]:
    """request id -> the chunks upstream's async-chunk function handed the code2wav node, as `ChunkPayload`s."""
    from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import ChunkPayload

    out: dict[str, list[Any]] = {}
    if family != "cosyvoice3":
        from vllm_omni_token2wav.model_executor.models.standin.toy.recorder import read_records

        for rid, lines in read_records(folder).items():
            out[rid] = [ChunkPayload(rid, tuple(r["codes"]), bool(r["last"]), n) for n, r in enumerate(lines)]
        return out
    import torch

    for path in sorted(folder.glob("*-talker2code2wav_async_chunk.pt")):  # the door's files sort by call time
        entry = torch.load(path, weights_only=False)
        rid, payload = str(entry["request_id"]), entry["result"]
        tokens = tuple(int(t) for t in payload["codes"]["audio"].reshape(-1).tolist())
        meta = payload["meta"]
        last = bool(meta.get("stream_finished", meta.get("finished", False)))
        offset = int(meta.get("left_context_size", 0) or 0) if tokens else None
        chunks = out.setdefault(rid, [])
        chunks.append(ChunkPayload(rid, tokens, last, len(chunks), offset=offset, embed=payload.get("embed")))
    return out


def compare_with_stage_alone(deployment: Deployment) -> None:
    """Each reply that passed against our stage alone on the recorded chunks, with the node's seed."""
    from tests.e2e.references import reference_stage, streamed_request

    family = deployment.family
    raw = json.loads(deployment.stats.read_text()) if deployment.stats.is_file() else {}
    records = _recorded_chunks(family, deployment.records)
    reference = reference_stage(family, deployment.model, async_chunk=True, max_rows=1)
    for outcome in deployment.outcomes:
        if not outcome.ok or outcome.key is None or outcome.audio is None:
            continue
        key = outcome.key
        if family != "cosyvoice3" and raw.get("voices", {}).get(key):
            outcome.detail += "; not compared (the request carried a voice the recorder does not keep)"
            continue
        matches = [r for r in records if key == r or key.startswith(f"{r}-") or r.startswith(f"{key}-")]
        if len(matches) != 1:
            outcome.ok = False
            outcome.detail += f"; node key {key} matches {len(matches)} recorded requests of {sorted(records)}"
            continue
        chunks = [replace(c, request_id=f"ref-{key}") for c in records[matches[0]]]
        served = [(len(c.tokens) - (c.offset or 0), c.last) for c in chunks]
        if [tuple(c) for c in raw["chunks"][key]] != served:
            outcome.ok = False
            outcome.detail += f"; the node served chunks {raw['chunks'][key]}, upstream sent {served}"
            continue
        want = np.clip(streamed_request(reference, chunks, int(raw["noise_seeds"][key])), -1.0, 1.0)
        if want.shape != outcome.audio.shape:
            outcome.ok = False
            outcome.detail += f"; stage alone gives {want.shape[0]} samples"
            continue
        diff = float(np.abs(outcome.audio.astype(np.float64) - want).max())
        outcome.ok = diff <= PCM_TOLERANCE
        outcome.detail += f"; vs our stage alone on the recorded chunks: max abs diff {diff:.1e} ({len(chunks)} chunks)"


def table(outcomes: list[Outcome], started: Mapping[str, str]) -> str:
    rows = ["| family | reply | result | detail |", "|---|---|---|---|"]
    for o in outcomes:
        rows.append(f"| {o.family} | {o.mode} | {'works' if o.ok else 'fails'} | {o.detail} |")
    rows += [f"\n{family}: {what}" for family, what in started.items()]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated, of " + ", ".join(FAMILIES))
    parser.add_argument("--tokens", type=int, default=40, help="codes per Step-Audio2 reply (pinned in the deployment)")
    parser.add_argument("--folder", type=Path, default=None, help="logs and overlays (default: a temp folder)")
    parser.add_argument("--startup-timeout", type=float, default=900.0)
    parser.add_argument("--request-timeout", type=float, default=300.0)
    parser.add_argument(
        "--no-reference", dest="reference", action="store_false", help="skip the comparison with our stage alone"
    )
    args = parser.parse_args(argv)
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        parser.error(f"unknown families {unknown}; choose from {', '.join(FAMILIES)}")
    root = args.folder or Path(tempfile.mkdtemp(prefix="split_pipelines_"))
    outcomes: list[Outcome] = []
    started: dict[str, str] = {}
    for family in families:  # one deployment alive at a time
        folder = root / family
        folder.mkdir(parents=True, exist_ok=True)
        try:
            deployment = start(family, folder, args.tokens, args.startup_timeout)
        except (RuntimeError, OSError) as exc:
            first = str(exc).splitlines()[0]
            outcomes += [Outcome(family, m, False, f"did not start: {first}") for m in ("whole", "streamed")]
            started[family] = f"did not start, logs in {folder}:\n{exc}"
            continue
        try:
            check(deployment, args.tokens, args.request_timeout)
        finally:
            deployment.kill()
        if args.reference:
            try:
                compare_with_stage_alone(deployment)
            except Exception as exc:  # noqa: BLE001 - a reference that cannot run is reported, the next family runs
                for outcome in deployment.outcomes:
                    outcome.ok = False
                    outcome.detail += f"; the reference did not run: {type(exc).__name__}: {exc}"
        outcomes += deployment.outcomes
        started[family] = f"ready in {deployment.started_s:.0f} s, logs in {folder}"
        print(table(deployment.outcomes, {}), flush=True)
    print(table(outcomes, started))
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
