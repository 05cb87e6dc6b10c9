# SPDX-License-Identifier: Apache-2.0
"""The code2wav stage on its own node: vLLM-Omni's split deployment on loopback, driven through the served API.

One split deployment for the module (README, "Running the code2wav stage on its own node"): the head
(`vllm-omni-token2wav serve <model> --deploy-config <yaml> --stage-id 0 -oma 127.0.0.1 -omp P`: the HTTP API, the
orchestrator and the stand-in producer) and a headless code2wav node (`... --stage-id 1 --headless -oma 127.0.0.1
-omp P`), each in its own process group, working folder and environment (the node's alone carries the stage's
counters file), the stage-0 -> stage-1 edge on `EDGE` (`MooncakeTransferEngineConnector` over TCP where the
`multinode` extra imports, as `tests/patch/worker/test_patch_mooncake_engine.py` configures it; else the shipped
SharedMemory edge).

Checks, in order (one deployment, the tests share it):
1. concurrent whole replies (`/v1/audio/speech`, WAV) and a streamed one (raw PCM) each equal, to the 16-bit PCM
   step, the stand-in producer's codes for the request's text chunked by upstream's own async-chunk function and
   streamed through our stage alone in this process, with the noise seed the node's stage used;
2. the node killed (its whole process group) while a streamed and a whole reply are in flight: both end within a
   minute (the orchestrator logs `stage-1: stage replica disappeared` for them; a whole reply answers 500 with it,
   a stream whose 200 header was sent ends short), the head stays up, `/health` turns 503 and a new request fails
   naming stage 1 ("Stage-1 has no live replica", `error_stage_id: 1`);
3. the node started again: vLLM-Omni 0.30's master server registers it as a new replica, `/health` is 200 again
   and a reply is whole;
4. two code2wav nodes behind the head: a second headless node (the same command, its own process group, folder and
   counters file) registers as one more replica of stage 1 beside the first (vLLM-Omni places each headless
   process as a replica; `--omni-dp-size-local K` would put K replicas in one process, which one node's loss takes
   down together). The head routes with `--omni-lb-policy round-robin` (upstream's default, `random`, leaves one
   node idle for 4 requests one time in 8): 4 concurrent whole replies are served by both nodes (each node's
   counters file holds new request keys) and each equals our stage alone; then the second node is killed while
   two replies are in flight: each ends within a minute, the one on the surviving node whole, the head detaches
   the lost replica and the next two replies are whole, both served by the surviving node.

Outside `tests/e2e/` (whose conftest puts this checkout on the engine processes' `PYTHONPATH`), the fixture puts it
on the served processes' `PYTHONPATH` itself.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import io
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.engines import FAST_STAGE_OPTIONS, SAMPLES_PER_TOKEN, StageCounters, wait_for
from tests.e2e.references import new_tokens, reference_stage, streamed_request, upstream_chunks
from tests.helpers.engine import require_engine
from tests.helpers.serve_process import ServeProcess
from vllm_omni_token2wav import envs
from vllm_omni_token2wav.benchmarks.token2wav_serve.edges import mooncake_connector
from vllm_omni_token2wav.deploy import deploy_config
from vllm_omni_token2wav.model_executor.models.standin.toy import write_overlay

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the split-deployment engine tests")

FAMILY = "step_audio2"
REPLY_TOKENS = 100  # the producer's reply length (stage 0 `max_tokens`): 4 chunks, 4 s of audio
STARTUP_TIMEOUT_S = 480.0
#: One 16-bit PCM step (the served audio is int16) plus float rounding.
PCM_TOLERANCE = 1.5 / 32768
HAS_MOONCAKE = importlib.util.find_spec("mooncake") is not None
EDGE = "mooncake" if HAS_MOONCAKE else "shared_memory"
REPO_ROOT = Path(__file__).resolve().parents[3]
#: The head marks a node that stopped reporting lost after this long (upstream's default 30 s; the nodes report
#: every 5 s, `omni_coord_client_for_stage.py`): a killed node's requests end and its replica is dropped ~15 s
#: sooner, in the kill test and in the two-node test.
HEARTBEAT_TIMEOUT_S = 15.0
#: The head answers SIGTERM by stopping its stages in ~8 s and then lingers; the group is killed after this.
STOP_WAIT_S = 15.0


def _free_port() -> int:
    from vllm_omni_token2wav.benchmarks.engine_server import free_port

    return free_port()


@dataclass
class Split:
    head: ServeProcess
    node: ServeProcess
    #: a second code2wav node (the same command in its own folder, with its own counters file)
    node2: ServeProcess
    url: str
    model: Path
    stats: Path
    stats2: Path
    node_starts: list[float] = field(default_factory=list)

    def start_node(self) -> None:
        self.node_starts.append(time.monotonic())
        self.node.start()

    def wait_healthy(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for proc in (self.head, self.node):
                if not proc.alive():
                    raise AssertionError(f"{proc.log.name} exited before the deployment was ready:\n{proc.tail()}")
            if health(self.url) == 200:
                return
            time.sleep(1.0)
        raise AssertionError(f"not healthy after {timeout_s:.0f} s:\n{self.head.tail()}\n---\n{self.node.tail()}")

    def counters(self) -> StageCounters:
        return StageCounters.read(self.stats)

    def head_log_count(self, text: str) -> int:
        return self.head.log.read_text(errors="replace").count(text)


#: the head's log lines for a stage-1 replica joining and leaving (vLLM-Omni 0.30 `engine/membership_controller.py`)
ATTACHED = "attached remote replica stage=1 "
DETACHED = "detached replica stage=1 "


def merged(*counters: StageCounters) -> StageCounters:
    """The counters of several nodes as one (request keys are unique across nodes)."""
    raw: dict[str, Any] = {"errors": 0, "noise_seeds": {}, "chunks": {}}
    for c in counters:
        raw["errors"] += c["errors"]
        raw["noise_seeds"].update(c["noise_seeds"])
        raw["chunks"].update(c["chunks"])
    return StageCounters(raw)


def health(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def speech(url: str, text: str, *, stream: bool, timeout_s: float = 120.0) -> tuple[int, bytes]:
    """POST /v1/audio/speech: (status, body) — a WAV, or the raw PCM stream's bytes (`stream_format: audio`)."""
    body: dict[str, Any] = {"input": text, "response_format": "wav"}
    if stream:
        body.update(response_format="pcm", stream=True, stream_format="audio")
    request = urllib.request.Request(
        f"{url}/v1/audio/speech", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            chunks = []
            with contextlib.suppress(OSError, http.client.HTTPException):  # a stream cut by the server ends it
                while piece := reply.read(4096):
                    chunks.append(piece)
            return int(reply.status), b"".join(chunks)
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def pcm(status_body: tuple[int, bytes], *, wav: bool) -> np.ndarray:
    status, body = status_body
    assert status == 200, body[:500]
    if wav:
        with wave.open(io.BytesIO(body)) as w:
            assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
            body = w.readframes(w.getnframes())
    return np.frombuffer(body, dtype="<i2").astype(np.float32) / 32768.0


def prompt_ids(model: Path, text: str) -> list[int]:
    """The stand-in producer's prompt for `text`: vLLM-Omni's Step-Audio2 speech adapter's chat prompt, tokenized
    (the bench's `ProducerCodes` computes it the same way for `bench token2wav-serve --engine`)."""
    from vllm_omni_token2wav.benchmarks.token2wav_serve.engine import ProducerCodes

    return ProducerCodes(model).prompt_ids(text)


def _edge_overlay() -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    stages: dict[int, dict[str, Any]] = {
        0: {"default_sampling_params": {"max_tokens": REPLY_TOKENS, "temperature": 0.0, "detokenize": False}},
        1: {"additional_config": FAST_STAGE_OPTIONS},
    }
    if EDGE != "mooncake":
        return stages, {}
    stages[0]["output_connectors"] = {"to_stage_1": "connector_of_mooncake"}
    stages[1]["input_connectors"] = {"from_stage_0": "connector_of_mooncake"}
    return stages, {"connectors": mooncake_connector(_free_port())}


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Split]:
    from vllm_omni_token2wav.model_executor.models.standin.model_dirs import ensure_engine_model_dir

    tmp = tmp_path_factory.mktemp("split")
    model = ensure_engine_model_dir(FAMILY)
    stages, top = _edge_overlay()
    deploy = write_overlay(tmp / "deploy.yaml", deploy_config(f"standin_{FAMILY}_stream"), stages, top=top)
    master_port, http_port = _free_port(), _free_port()
    common = [str(model), "--deploy-config", str(deploy), "-oma", "127.0.0.1", "-omp", str(master_port)]
    stats, stats2 = tmp / "node" / "stage_stats.json", tmp / "node2" / "stage_stats.json"
    base_env = {k: v for k, v in os.environ.items() if k != envs.STAGE_STATS_ENV}
    base_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), base_env.get("PYTHONPATH", "")) if p)
    head = ServeProcess(
        [*common, "--stage-id", "0", "--host", "127.0.0.1", "--port", str(http_port)]
        + ["--omni-lb-policy", "round-robin", "--omni-heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S)],
        tmp / "head",
        dict(base_env),
        tmp / "head.log",
    )
    node = ServeProcess(
        [*common, "--stage-id", "1", "--headless"],
        tmp / "node",
        {**base_env, envs.STAGE_STATS_ENV: str(stats)},
        tmp / "node.log",
    )
    node2 = ServeProcess(
        [*common, "--stage-id", "1", "--headless"],
        tmp / "node2",
        {**base_env, envs.STAGE_STATS_ENV: str(stats2)},
        tmp / "node2.log",
    )
    deployment = Split(head, node, node2, f"http://127.0.0.1:{http_port}", model, stats, stats2)
    try:
        head.start()
        deployment.start_node()
        deployment.wait_healthy()
        yield deployment
    finally:
        node2.kill(signal.SIGTERM, STOP_WAIT_S)
        node.kill(signal.SIGTERM, STOP_WAIT_S)
        head.kill(signal.SIGTERM, STOP_WAIT_S)


def _reference_check(
    split: Split, replies: dict[str, np.ndarray], known: set[str], counters: StageCounters | None = None
) -> set[str]:
    """Each reply equals our stage alone on its text's codes with the seed of exactly one new stage key
    (of `counters`: the node's by default)."""
    counters = counters or split.counters()
    assert counters["errors"] == 0, counters.raw
    new_keys = sorted(set(counters["noise_seeds"]) - known)
    assert len(new_keys) == len(replies), (new_keys, list(replies))
    reference = reference_stage(FAMILY, split.model, async_chunk=True)
    matched: set[str] = set()
    for n, (text, audio) in enumerate(replies.items()):
        assert audio.shape == (SAMPLES_PER_TOKEN * REPLY_TOKENS,), (text, audio.shape)
        prompt = prompt_ids(split.model, text)
        want_chunks = [(new_tokens(c), c.last) for c in upstream_chunks(FAMILY, "r", prompt, REPLY_TOKENS)]
        # which new key is this reply's: the one whose seed gives the reply's first chunk (a fresh reference
        # stream per try: the stage keeps a stream per request id)
        first: dict[str, float] = {}
        for key in new_keys:
            if key in matched or counters.chunks(key) != want_chunks:
                continue
            head = upstream_chunks(FAMILY, f"first-{n}-{key}", prompt, REPLY_TOKENS)[:1]
            piece = np.clip(streamed_request(reference, head, counters.seed(key)), -1.0, 1.0)
            first[key] = float(np.abs(audio[: piece.shape[0]].astype(np.float64) - piece).max())
        key = min(first, key=first.__getitem__) if first else None
        assert key is not None and first[key] <= PCM_TOLERANCE, (text, first)
        chunks = upstream_chunks(FAMILY, f"whole-{n}-{key}", prompt, REPLY_TOKENS)
        want = np.clip(streamed_request(reference, chunks, counters.seed(key)), -1.0, 1.0)
        assert float(np.abs(audio.astype(np.float64) - want).max()) <= PCM_TOLERANCE, (text, key)
        matched.add(key)
    return set(counters["noise_seeds"])


def test_whole_and_streamed_replies_from_the_node_equal_the_stage_alone(split: Split) -> None:
    texts = ["split whole one", "Split whole two!"]
    results: dict[str, tuple[int, bytes]] = {}

    def fetch(text: str, stream: bool) -> None:
        results[text] = speech(split.url, text, stream=stream)

    threads = [threading.Thread(target=fetch, args=(t, False)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    replies = {t: pcm(results[t], wav=True) for t in texts}
    known = _reference_check(split, replies, set())
    streamed = "split streamed reply"
    _reference_check(split, {streamed: pcm(speech(split.url, streamed, stream=True), wav=False)}, known)


def test_the_node_killed_mid_stream_fails_its_requests_and_the_head_serves_again_once_it_is_back(
    split: Split,
) -> None:
    results: dict[str, Any] = {}
    started: dict[str, float] = {}

    def fetch(name: str, stream: bool) -> None:
        started[name] = time.monotonic()
        try:
            results[name] = speech(split.url, f"killed {name}", stream=stream, timeout_s=90)
        except Exception as exc:  # noqa: BLE001 - a connection the head dropped is one of the allowed endings
            results[name] = (-1, repr(exc).encode())
        results[name + "_s"] = time.monotonic() - started[name]

    threads = [threading.Thread(target=fetch, args=(n, n == "stream")) for n in ("stream", "whole")]
    for t in threads:
        t.start()
    time.sleep(0.6)  # both admitted; a 100-code reply takes ~2 s here
    split.node.kill(signal.SIGKILL)
    killed_at = time.monotonic()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a request hung after the node was killed"
    assert split.head.alive(), split.head.tail()
    status, body = results["whole"]
    stream_status, stream_body = results["stream"]
    # the whole reply fails naming the lost stage; the stream ends short (its 200 header was already sent)
    assert (status == 500 and b"replica disappeared" in body) or status in (200, -1), (status, body[:400])
    assert len(stream_body) < 2 * SAMPLES_PER_TOKEN * REPLY_TOKENS or stream_status != 200
    assert time.monotonic() - killed_at < 60
    log = split.head.log.read_text(errors="replace")
    assert "stage-1: stage replica disappeared" in log, split.head.tail()

    deadline = time.monotonic() + 60
    while health(split.url) != 503 and time.monotonic() < deadline:
        time.sleep(1.0)
    assert health(split.url) == 503
    status, body = speech(split.url, "while the node is down", stream=False, timeout_s=60)
    assert status == 500, body[:400]
    error = json.loads(body)["error"]
    assert "Stage-1 has no live replica" in error["message"] and error.get("error_stage_id") == 1, error

    split.start_node()  # same command, folder and environment: registers as a new replica
    split.wait_healthy()
    audio = pcm(speech(split.url, "after the node came back", stream=False), wav=True)
    assert audio.shape == (SAMPLES_PER_TOKEN * REPLY_TOKENS,)


def _whole_replies(split: Split, texts: list[str], *, kill: ServeProcess | None = None) -> dict[str, tuple[int, bytes]]:
    """`texts` as concurrent whole replies; with `kill`, that node's process group is killed 0.6 s in. Each
    request is bounded (90 s) and the threads must end."""
    results: dict[str, tuple[int, bytes]] = {}

    def fetch(text: str) -> None:
        try:
            results[text] = speech(split.url, text, stream=False, timeout_s=90)
        except Exception as exc:  # noqa: BLE001 - a connection the head dropped is one of the allowed endings
            results[text] = (-1, repr(exc).encode())

    threads = [threading.Thread(target=fetch, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    if kill is not None:
        time.sleep(0.6)  # admitted and routed; a 100-code reply takes ~2 s here
        kill.kill(signal.SIGKILL)
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a request hung"
    return results


def test_two_nodes_behind_the_head_share_requests_and_one_killed_leaves_the_other_serving(split: Split) -> None:
    assert split.node.alive() and health(split.url) == 200, "the previous test leaves one node serving"
    attached = split.head_log_count(ATTACHED)
    split.node2.start()
    wait_for(
        lambda: split.head_log_count(ATTACHED) > attached or not split.node2.alive(),
        timeout_s=STARTUP_TIMEOUT_S,
        what="the second node registered as a replica of stage 1",
    )
    assert split.node2.alive(), split.node2.tail()

    # both nodes serve: round-robin over the two live replicas
    known = set(split.counters()["noise_seeds"])
    texts = [f"two nodes reply {i}" for i in range(4)]
    results = _whole_replies(split, texts)
    replies = {t: pcm(results[t], wav=True) for t in texts}
    first, second = split.counters(), StageCounters.read(split.stats2)
    on_first, on_second = set(first["noise_seeds"]) - known, set(second["noise_seeds"])
    assert on_first and on_second and len(on_first) + len(on_second) == len(texts), (on_first, on_second)
    _reference_check(split, replies, known, merged(first, second))

    # the second node killed with a reply in flight on each node: both end, the first node's whole
    detached = split.head_log_count(DETACHED)
    known = set(split.counters()["noise_seeds"])
    killed_at = time.monotonic()
    results = _whole_replies(split, ["one node lost a", "one node lost b"], kill=split.node2)
    assert time.monotonic() - killed_at < 90
    assert split.head.alive() and split.node.alive(), split.head.tail()
    served = set(split.counters()["noise_seeds"]) - known
    assert served, "the surviving node served neither reply"  # round-robin: one of the two was routed to it
    statuses = {text: status for text, (status, _) in results.items()}
    whole = [t for t, (status, body) in results.items() if status == 200]
    assert whole and len(whole) <= len(served), (statuses, served)
    for text in whole:
        assert pcm(results[text], wav=True).shape == (SAMPLES_PER_TOKEN * REPLY_TOKENS,), text
    for status, body in results.values():
        assert status == 200 or (status == 500 and b"replica disappeared" in body) or status == -1, (status, body)
    wait_for(
        lambda: split.head_log_count(DETACHED) > detached,
        timeout_s=60,
        what="the head detached the lost node's replica",
    )
    assert health(split.url) == 200

    # the surviving node serves what comes next
    known = set(split.counters()["noise_seeds"])
    texts = ["after one node was lost", "After one node was lost!"]
    results = _whole_replies(split, texts)
    replies = {t: pcm(results[t], wav=True) for t in texts}
    _reference_check(split, replies, known)
