# SPDX-License-Identifier: Apache-2.0
"""`{replica}` in `VLLM_OMNI_TOKEN2WAV_STAGE_STATS`: each replica of a stage (`num_replicas` > 1) writes its own file.

vLLM-Omni sets `VLLM_OMNI_REPLICA_ID` in each replica's engine-core process; the stage model reads it only to
name its stats file, so two replicas never overwrite each other's counters (`tests/e2e/test_replicas.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.model_executor.models.token2wav_stage.conftest import FAST_OPTIONS
from vllm_omni_token2wav import envs
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav import MiniCPMO45Code2Wav
from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import ProducerStream, all_chunks, forward_inputs

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]


@pytest.mark.parametrize(
    ("replica_id", "written"),
    [("1", "stats_1.json"), (None, "stats_0.json"), ("not-a-number", "stats_0.json"), ("-3", "stats_0.json")],
)
def test_the_replica_placeholder_names_the_file_by_the_engines_replica_id(
    replica_id: str | None, written: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(envs.STAGE_STATS_ENV, str(tmp_path / "stats_{replica}.json"))
    if replica_id is None:
        monkeypatch.delenv("VLLM_OMNI_REPLICA_ID", raising=False)
    else:
        monkeypatch.setenv("VLLM_OMNI_REPLICA_ID", replica_id)
    assert envs.stage_stats_path() == str(tmp_path / written)


def test_a_path_without_the_placeholder_is_used_as_given_whatever_the_replica(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(envs.STAGE_STATS_ENV, str(tmp_path / "stats.json"))
    monkeypatch.setenv("VLLM_OMNI_REPLICA_ID", "1")
    assert envs.stage_stats_path() == str(tmp_path / "stats.json")


def test_two_replicas_of_a_stage_write_two_files(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(envs.STAGE_STATS_ENV, str(tmp_path / "stats_{replica}.json"))
    for replica, rid in (("0", "a"), ("1", "b")):  # two stage models, as two replica processes hold them
        monkeypatch.setenv("VLLM_OMNI_REPLICA_ID", replica)
        stage = MiniCPMO45Code2Wav(model=str(model_dir), async_chunk=True, **FAST_OPTIONS)
        chunk = all_chunks(ProducerStream(rid, list(range(100, 130)), stage.family))[0]
        ids, kwargs = forward_inputs([chunk], stage.family)
        stage(torch.as_tensor(ids, dtype=torch.int32), None, **kwargs)
    seen = {r: json.loads((tmp_path / f"stats_{r}.json").read_text()) for r in (0, 1)}
    assert [list(seen[r]["chunks"]) for r in (0, 1)] == [["a"], ["b"]]
