# SPDX-License-Identifier: Apache-2.0
"""The real stage measures its whole-utterance steps and publishes the cost model on its output (issue 32).

Driven as vLLM-Omni's runner drives it (one flat `input_ids`, per-segment dicts): the first whole step is not
measured (one-time costs), the next steps of whole utterances are counted into the model (rows 2, then 1: both
`solo_seen` and `batch_seen`), a step with a stream chunk is not; the model rides on the first segment as
`COST_KEY` (empty tensors on the others), from the second measured step on; a step with stream chunks carries
each chunk's new audio seconds under `PLAYBACK_KEY` (empty for the other segments; the scheduler's due order,
`playback.py`); `additional_config: token2wav_latency_planning: false` publishes nothing.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.model_executor.models.token2wav_stage.conftest import FAST_OPTIONS
from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import ProducerStream, all_chunks, forward_inputs
from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav_stage import (
    StepAudio2Token2WavForConditionalGeneration as Stage,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.cost_model import COST_KEY, CostModel
from vllm_omni_token2wav.model_executor.models.token2wav_stage.playback import PLAYBACK_KEY, decode_seconds

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]


def _whole(stage: Stage, requests: dict[str, list[int]]) -> dict[str, Any]:
    ids = torch.tensor([t for tokens in requests.values() for t in tokens])
    kwargs = {
        "seq_token_counts": [len(t) for t in requests.values()],
        "request_ids": list(requests),
        "runtime_additional_information": [{"codes": {"audio": torch.tensor(t)}} for t in requests.values()],
    }
    return stage(ids, None, **kwargs).multimodal_outputs


def test_whole_steps_are_measured_and_published_stream_steps_are_not(model_dir: Path) -> None:
    stage = Stage(model=str(model_dir), **FAST_OPTIONS)
    warm = _whole(stage, {"w": list(range(10, 22))})
    assert COST_KEY not in warm and stage.costs is not None and stage.costs.samples == 0  # first-call costs
    first = _whole(stage, {"a": list(range(10, 22)), "b": list(range(30, 38))})
    assert COST_KEY not in first  # one measured step: no model yet
    assert PLAYBACK_KEY not in first  # no stream chunk
    second = _whole(stage, {"c": list(range(40, 50))})
    model = CostModel.decode(second[COST_KEY][0])
    assert model is not None and (model.samples, model.solo_seen, model.batch_seen) == (2, True, True)
    assert len(second[COST_KEY]) == 1

    chunk = all_chunks(ProducerStream("s", list(range(100, 160)), Stage.family))[0]
    ids, kwargs = forward_inputs([chunk], Stage.family)
    ids = torch.cat([ids, torch.tensor(list(range(5, 11)))])
    kwargs["seq_token_counts"].append(6)
    kwargs["request_ids"].append("w")
    kwargs["runtime_additional_information"].append({"codes": {"audio": torch.tensor(list(range(5, 11)))}})
    mixed = stage(ids, None, **kwargs).multimodal_outputs
    published = CostModel.decode(mixed[COST_KEY][0])
    assert published is not None and published.samples == 2  # the mixed step was not measured
    assert mixed[COST_KEY][1].numel() == 0
    served = mixed["model_outputs"][0].numel()
    assert served > 0 and decode_seconds(mixed[PLAYBACK_KEY][0]) == pytest.approx(served / 24000)
    assert mixed[PLAYBACK_KEY][1].numel() == 0  # the whole utterance: not a stream


def test_the_off_switch_publishes_nothing(model_dir: Path) -> None:
    config = SimpleNamespace(
        model_config=SimpleNamespace(model=str(model_dir), hf_config=SimpleNamespace(), stage_connector_config={}),
        device_config=SimpleNamespace(device=torch.device("cpu")),
        scheduler_config=SimpleNamespace(max_num_seqs=4),
        load_config=SimpleNamespace(load_format="dummy"),
        additional_config={"token2wav_latency_planning": False},
    )
    stage = Stage(vllm_config=config, n_timesteps=2, reference_seconds=1.5)
    assert stage.costs is None
    for rid in ("a", "b", "c"):
        assert COST_KEY not in _whole(stage, {rid: list(range(10, 20))})
    chunk = all_chunks(ProducerStream("s", list(range(100, 160)), Stage.family))[0]
    ids, kwargs = forward_inputs([chunk], Stage.family)
    assert PLAYBACK_KEY not in stage(ids, None, **kwargs).multimodal_outputs
