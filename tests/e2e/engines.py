# SPDX-License-Identifier: Apache-2.0
"""The real vLLM-Omni engine as the end-to-end tests drive it: deployments, offline engines, the stage's counters.

An engine takes 1-2 minutes to start on a 2-core CPU, so each test module builds one engine per
deployment (module-scoped fixtures) and submits its requests concurrently through `AsyncOmni`: its
`generate(prompt, request_id=...)` raises a failed request's error in that request's generator only,
while upstream's synchronous `Omni.generate([...])` raises on the first failed request and closes the
engine (so it cannot show one request failing alone).

- `deployment(...)`: a deploy YAML overlay in a temporary folder: `base_config: <shipped yaml>` plus
  only what a test changes (vLLM-Omni deep-merges `stages` by `stage_id`), e.g. 2 Euler steps through
  the stage's `additional_config` (`token2wav_n_timesteps`, read by `options.py`).
- `OfflineEngine`: `AsyncOmni` on a deployment, with `VLLM_OMNI_TOKEN2WAV_STAGE_STATS` pointing at its
  own file while it starts (the worker processes inherit the variable when they are spawned).
- `StageCounters`: that file, as the code2wav worker last wrote it, with the engine's request keys
  (`r2` -> `r2-a9cf3b8b`) found by prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vllm_omni_token2wav import envs
from vllm_omni_token2wav.deploy import deploy_config
from vllm_omni_token2wav.model_executor.models.standin.toy import write_overlay

#: Stage options every end-to-end deployment overrides: 2 Euler steps (the numerics under test do not
#: depend on the step count; 10 steps cost 5x the stage time on a 2-core CPU).
FAST_STAGE_OPTIONS: dict[str, Any] = {"token2wav_n_timesteps": 2}
STAGE_INIT_TIMEOUT_S = 300
#: How long one offline request may take before the test calls it hung (tens of ms of stage work each).
REQUEST_TIMEOUT_S = 120.0
SAMPLES_PER_TOKEN = 960  # 24 kHz audio, 25 Hz codec tokens


def deployment(folder: Path, name: str, stages: Mapping[int, Mapping[str, Any]]) -> Path:
    """`folder/<name>.yaml`: the shipped deploy YAML `name` with `stages` ({stage_id: {key: value}}) over it."""
    return write_overlay(folder / f"{name}.yaml", deploy_config(name), stages)


@dataclass(frozen=True)
class StageCounters:
    """`VLLM_OMNI_TOKEN2WAV_STAGE_STATS` as last written (`token2wav_stage/stats.py` documents the fields)."""

    raw: dict[str, Any]

    @classmethod
    def read(cls, path: Path) -> StageCounters:
        if not path.is_file():
            raise AssertionError(f"{path}: the code2wav stage never wrote its counters (was it built?)")
        raw = json.loads(path.read_text())
        if "noise_seeds" not in raw:  # a worker that imported another checkout's package
            raise AssertionError(f"{path} has no noise_seeds: the engine ran another vllm_omni_token2wav: {raw}")
        return cls(raw)

    def __getitem__(self, name: str) -> Any:
        return self.raw[name]

    def key(self, request_id: str) -> str:
        """The engine's key of `request_id` (it appends `-<hex>`); AssertionError unless exactly one matches."""
        keys = [k for k in self.raw["noise_seeds"] if k == request_id or k.startswith(f"{request_id}-")]
        if len(keys) != 1:
            raise AssertionError(f"request {request_id!r}: {len(keys)} stage keys match ({keys})")
        return keys[0]

    def seed(self, request_id: str) -> int:
        return int(self.raw["noise_seeds"][self.key(request_id)])

    def voice(self, request_id: str) -> str | None:
        """The voice key the stage read for the request (`stats.py` `voices`), None if it named none."""
        return self.raw.get("voices", {}).get(self.key(request_id))

    def chunks(self, request_id: str) -> list[tuple[int, bool]]:
        """`[(tokens, last)]` of every segment the stage served for the request."""
        return [(int(n), bool(last)) for n, last in self.raw["chunks"][self.key(request_id)]]


def wait_for(predicate: Any, *, timeout_s: float, what: str) -> Any:
    """Poll `predicate()` until it returns something truthy (returned), or fail naming `what`."""
    deadline = time.monotonic() + timeout_s
    value = predicate()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not true after {timeout_s:.0f} s")
        time.sleep(0.2)
        value = predicate()
    return value


@dataclass
class Outcome:
    """One request's result: every audio output in arrival order (cumulative), or the error it raised."""

    request_id: str
    audio: list[np.ndarray] = field(default_factory=list)
    sample_rate: int | None = None
    error: BaseException | None = None
    #: token ids of the request's text outputs (a pipeline whose first stage is also a final text stage), the
    #: latest output's (cumulative outputs: the whole reply so far)
    text_token_ids: list[int] = field(default_factory=list)
    text_outputs: int = 0
    outputs_without_sr: int = 0

    @property
    def final(self) -> np.ndarray:
        if self.error is not None:
            raise AssertionError(f"request {self.request_id} failed: {self.error}")
        if not self.audio:
            raise AssertionError(f"request {self.request_id} returned no audio")
        return self.audio[-1]


class OfflineEngine:
    """`vllm_omni.AsyncOmni` on a deployment (see the module docstring); `close()` shuts it down."""

    def __init__(self, model: Path, deploy: Path, stats_path: Path) -> None:
        from vllm_omni import AsyncOmni

        # One event loop for the engine's whole life, running in its own thread: AsyncOmni binds its output
        # handling to the loop of its first `generate`, so requests submitted from a second `asyncio.run`
        # were computed by the stage and never delivered (their generators waited forever).
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="e2e-engine-loop", daemon=True)
        self._thread.start()

        from vllm_omni_token2wav.plugins import load_plugins

        load_plugins()  # our pipelines must be registered before AsyncOmni resolves the deployment's
        self.model = model
        self.stats_path = stats_path
        previous = os.environ.get(envs.STAGE_STATS_ENV)
        os.environ[envs.STAGE_STATS_ENV] = str(stats_path)
        try:
            self.omni = AsyncOmni(model=str(model), deploy_config=str(deploy), stage_init_timeout=STAGE_INIT_TIMEOUT_S)
        finally:
            if previous is None:
                del os.environ[envs.STAGE_STATS_ENV]
            else:
                os.environ[envs.STAGE_STATS_ENV] = previous

    def counters(self) -> StageCounters:
        return StageCounters.read(self.stats_path)

    def run(
        self,
        requests: Mapping[str, tuple[dict[str, Any], Sequence[Any] | None]],
        *,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> dict[str, Outcome]:
        """Submit every `{request_id: (prompt, sampling_params_list)}` at once; wait for all of them.

        A request whose outputs have not ended after `timeout_s` is cancelled and fails with a TimeoutError
        saying how far it got (a test names the request that hung instead of hanging itself).
        """

        async def outputs(outcome: Outcome, prompt: dict[str, Any], params: Sequence[Any] | None) -> None:
            kwargs = {} if params is None else {"sampling_params_list": list(params)}
            async for out in self.omni.generate(prompt, request_id=outcome.request_id, **kwargs):
                if getattr(out, "final_output_type", "audio") != "audio":  # a thinker's text output
                    completion = out.outputs[0] if out.outputs else None
                    if completion is not None:
                        outcome.text_token_ids = [int(t) for t in completion.token_ids]
                        outcome.text_outputs += 1
                    continue
                tensors = out.multimodal_output.tensors
                audio = tensors["audio"]
                outcome.audio.append(audio.numpy() if isinstance(audio, torch.Tensor) else np.asarray(audio))
                if "sr" in tensors:
                    outcome.sample_rate = int(tensors["sr"])
                else:  # upstream's Step-Audio2 class leaves it out of some outputs
                    outcome.outputs_without_sr += 1

        async def one(request_id: str, prompt: dict[str, Any], params: Sequence[Any] | None) -> Outcome:
            outcome = Outcome(request_id)
            try:
                await asyncio.wait_for(outputs(outcome, prompt, params), timeout_s)
            except asyncio.TimeoutError:
                outcome.error = TimeoutError(
                    f"request {request_id}: its outputs did not end within {timeout_s:.0f} s "
                    f"({len(outcome.audio)} outputs received)"
                )
            except Exception as exc:  # noqa: BLE001 - the request's own failure is its outcome
                outcome.error = exc
            return outcome

        async def all_of() -> list[Outcome]:
            return await asyncio.gather(*(one(rid, prompt, params) for rid, (prompt, params) in requests.items()))

        future = asyncio.run_coroutine_threadsafe(all_of(), self._loop)
        return {o.request_id: o for o in future.result(timeout=timeout_s + 60)}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.omni.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


__all__ = [
    "FAST_STAGE_OPTIONS",
    "SAMPLES_PER_TOKEN",
    "OfflineEngine",
    "Outcome",
    "StageCounters",
    "deployment",
    "wait_for",
]
