# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the end-to-end tests: this checkout in every engine process, and the served deployments.

Engine processes (vLLM's engine cores and workers, a `vllm-omni-token2wav serve` process) import
`vllm_omni_token2wav` on their own. An editable install in the environment may point at another checkout;
`PYTHONPATH` is set to this one before any engine starts, so every process runs the code under test.

The served deployments start once per run of this folder (a served process takes ~2 minutes on a 2-core
CPU) and are shared by every test that needs them: the stand-in Step-Audio2 stream (`/v1/audio/speech`) and
Step-Audio2's code2wav stage alone (`/v1/completions` with codec ids). The served tests run last; the
first of them launches both servers together (their start-ups overlap) and each test waits until `/health`
answers. They used to start with the folder's first test, to come up while the offline tests ran, but then
held ~4 GB idle for the whole folder while the suite's other engine unit runs beside it on the second xdist
worker (tests/conftest.py `work_unit`): on the 24 GB host memory matters more than those ~2 minutes. Each
writes its code2wav stage's counters to its own `VLLM_OMNI_TOKEN2WAV_STAGE_STATS` file; every process group
is stopped after the folder's last test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.engines import FAST_STAGE_OPTIONS, StageCounters, deployment
from vllm_omni_token2wav import envs

REPO_ROOT = Path(__file__).resolve().parents[2]
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)

SERVER_STARTUP_TIMEOUT_S = 420.0


@dataclass
class Served:
    """A running `vllm-omni-token2wav serve` (`EngineServer`) and where its stage writes its counters."""

    server: object
    model: Path
    stats_path: Path

    @property
    def url(self) -> str:
        return self.server.url  # type: ignore[attr-defined]

    def counters(self) -> StageCounters:
        return StageCounters.read(self.stats_path)

    def log_tail(self, lines: int = 60) -> str:
        text = self.server.log_path.read_text(errors="replace")  # type: ignore[attr-defined]
        return "\n".join(text.splitlines()[-lines:])


#: Reply length (codes) of a served deployment with a producer. 12 chunks of 25: a client that drops its
#: connection after the first bytes must be seen by the engine while most of its stream is still to come
#: (with the YAML's 100 codes, 4 chunks, a loaded host let the whole reply finish first).
PRODUCER_REPLY_TOKENS: dict[str, int] = {"standin_step_audio2_stream": 300}

#: fixture name -> (family, shipped deploy YAML, the code2wav stage's id in it)
SERVED = {
    "stream_server": ("step_audio2", "standin_step_audio2_stream", 1),
    "code2wav_server": ("step_audio2", "step_audio2_code2wav", 0),
}


def _launch(tmp: Path, family: str, name: str, stage_id: int) -> Served:
    from vllm_omni_token2wav.benchmarks.engine_server import EngineServer
    from vllm_omni_token2wav.model_executor.models.standin.model_dirs import ensure_engine_model_dir

    model = ensure_engine_model_dir(family)
    stats = tmp / "stage_stats.json"
    stages: dict[int, dict[str, Any]] = {stage_id: {"additional_config": FAST_STAGE_OPTIONS}}
    if name in PRODUCER_REPLY_TOKENS:
        # The producer (stage 0) makes every reply this long; the speech endpoint does not pass a request's
        # `max_new_tokens` on, so this is the only length a served stream can have.
        sampling = {"max_tokens": PRODUCER_REPLY_TOKENS[name], "temperature": 0.0, "detokenize": False}
        stages[0] = {"default_sampling_params": sampling}
    deploy = deployment(tmp, name, stages)
    server = EngineServer(
        model=model,
        deploy=deploy,
        log_path=tmp / "serve.log",
        env={envs.STAGE_STATS_ENV: str(stats)},
        startup_timeout_s=SERVER_STARTUP_TIMEOUT_S,
    )
    server.launch()
    return Served(server, model, stats)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Among this folder's tests, the served ones last (their servers start with the first of them)."""
    here = Path(__file__).parent
    slots = [i for i, item in enumerate(items) if here in Path(str(item.path)).parents]
    ordered = sorted((items[i] for i in slots), key=lambda it: bool(set(getattr(it, "fixturenames", ())) & set(SERVED)))
    for i, item in zip(slots, ordered, strict=True):
        items[i] = item


@dataclass
class ServedDeployments:
    """The folder's served deployments: launched together when the first served test asks for one (their start-ups
    overlap), stopped after the folder's last test. Not at the folder's first test: idle for the whole folder they
    held ~4 GB while the suite's other engine unit runs beside this folder (tests/conftest.py `work_unit`)."""

    wanted: set[str]
    tmp_path_factory: pytest.TempPathFactory
    launched: dict[str, Served] = field(default_factory=dict)

    def ready(self, name: str) -> Served:
        if not self.launched:
            for wanted in sorted(self.wanted | {name}):
                self.launched[wanted] = _launch(self.tmp_path_factory.mktemp(wanted), *SERVED[wanted])
        served = self.launched[name]
        served.server.wait_ready()  # type: ignore[attr-defined]
        return served


@pytest.fixture(scope="package", autouse=True)
def _served_deployments(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServedDeployments]:
    """Every served deployment this folder's collected tests use (started on first use, stopped after its last
    test: package scope, so the rest of a full run does not carry idle servers)."""
    wanted = {name for item in request.session.items for name in getattr(item, "fixturenames", ()) if name in SERVED}
    deployments = ServedDeployments(wanted, tmp_path_factory)
    try:
        yield deployments
    finally:
        for served in deployments.launched.values():
            served.server.stop()  # type: ignore[attr-defined]


@pytest.fixture(scope="package")
def stream_server(_served_deployments: ServedDeployments) -> Served:
    """`standin_step_audio2_stream` served on 127.0.0.1 (stand-in producer -> our code2wav, 2 Euler steps)."""
    return _served_deployments.ready("stream_server")


@pytest.fixture(scope="package")
def code2wav_server(_served_deployments: ServedDeployments) -> Served:
    """`step_audio2_code2wav` served on 127.0.0.1: requests are codec ids (`/v1/completions`)."""
    return _served_deployments.ready("code2wav_server")
