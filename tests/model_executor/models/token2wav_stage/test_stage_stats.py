# SPDX-License-Identifier: Apache-2.0
"""`VLLM_OMNI_TOKEN2WAV_STAGE_STATS`: the counters engine tests read from the worker process, and their cost when off.

Expected counters are worked out by hand from the schedule each test drives (which calls carry
work, how many segments, which fail, which streams end), not read back from the code under test.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.model_executor.models.token2wav_stage.conftest import FAST_OPTIONS
from vllm_omni_token2wav import envs
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav import MiniCPMO45Code2Wav
from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import ProducerStream, all_chunks, forward_inputs
from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav_stage import (
    StepAudio2Token2WavForConditionalGeneration,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage import stats as stats_module
from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import segment_errors

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]


def documented_seed(request_id: str, stage_seed: int = 0, epoch: int = 0) -> int:
    """The default noise seed as docs/design/token2wav_stage.md states it: sha256(stage seed, request id, epoch)."""
    digest = hashlib.sha256(f"{stage_seed}:{request_id}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def _placeholder(rid: str) -> dict[str, Any]:
    return {"global_request_id": [rid], "omni_final_stage_id": 0, "generated_len": 0}


def _call(stage: MiniCPMO45Code2Wav, items: list[Any]) -> list[str | None]:
    """One forward call: `items` are producer chunks or request ids (a pre-warm placeholder of that request)."""
    ids: list[int] = []
    counts: list[int] = []
    infos: list[dict[str, Any]] = []
    rids: list[str] = []
    for item in items:
        if isinstance(item, str):
            ids, counts, infos, rids = [*ids, 0], [*counts, 1], [*infos, _placeholder(item)], [*rids, item]
            continue
        chunk_ids, kwargs = forward_inputs([item], stage.family)
        ids += chunk_ids.tolist()
        counts += kwargs["seq_token_counts"]
        infos += kwargs["runtime_additional_information"]
        rids += kwargs["request_ids"]
    out = stage(
        torch.tensor(ids, dtype=torch.int32),
        None,
        runtime_additional_information=infos,
        seq_token_counts=counts,
        request_ids=rids,
    )
    return segment_errors(out.multimodal_outputs)


@pytest.fixture
def stage(model_dir: Path) -> MiniCPMO45Code2Wav:
    return MiniCPMO45Code2Wav(model=str(model_dir), async_chunk=True, **FAST_OPTIONS)


def test_the_stats_file_counts_calls_segments_batching_placeholders_errors_and_streams(
    stage: MiniCPMO45Code2Wav, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "stats" / "stage.json"
    monkeypatch.setenv(envs.STAGE_STATS_ENV, str(path))
    a, b = (all_chunks(ProducerStream(rid, list(range(100, 160)), stage.family)) for rid in "ab")
    assert len(b) == 3  # 25 + 25 new tokens, then the last 10

    stage(torch.zeros(4, dtype=torch.int32), None, runtime_additional_information=None, seq_token_counts=[4])
    _call(stage, ["a", "b"])  # pre-warm placeholders of two requests
    assert _call(stage, [a[0], b[0], "c"]) == [None, None, None]  # two requests batched, one placeholder
    errors = _call(stage, [a[0]])  # chunk 0 of a again: rejected
    assert errors[0] is not None and "repeated chunk" in errors[0]
    _call(stage, [b[1]])
    _call(stage, [b[2]])  # b's last chunk ends its stream
    seen = json.loads(path.read_text())
    by_rows = seen.pop("steps_by_rows")
    assert {k: v["steps"] for k, v in by_rows.items()} == {"1": 3, "2": 1}  # a+b together, a again, b, b
    assert all(v["seconds"] > 0 and v["cpu_seconds"] > 0 for v in by_rows.values())
    assert seen.pop("work_forward_s") == pytest.approx(sum(v["seconds"] for v in by_rows.values()))
    assert seen.pop("work_forward_cpu_s") == pytest.approx(sum(v["cpu_seconds"] for v in by_rows.values()))
    assert seen.pop("stats_write_s") > 0  # the five earlier writes (the file lags its own cost by one call)
    budget = seen.pop("memory_budget_bytes")  # auto: a share of this host's available RAM
    assert budget == stage.executor.config.memory_budget and budget > 0
    assert seen.pop("live_stream_bytes") == stage.executor.live_bytes() > 0  # a's stream
    assert seen.pop("bytes_per_token") == 0.0  # not measured: the backend estimates streams (estimate_stream_bytes)
    assert seen == {
        "family": "minicpmo_4_5",
        "pid": os.getpid(),
        "forward_calls": 6,
        "steps_with_work": 4,
        "segments": 2 + 3 + 1 + 1 + 1,
        "max_segments_per_step": 3,
        "multi_request_steps": 1,
        "placeholder_segments": 3,
        "errors": 1,
        "live_streams": 1,  # a's stream
        "streams_finished": 1,
        "last_error": errors[0],
        "noise_seeds": {"a": documented_seed("a"), "b": documented_seed("b")},
        # MiniCPM-o chunks: 3 context codes + 25 new, then 3 + the last 10; a's repeated chunk 0 failed
        "chunks": {"a": [[28, False]], "b": [[28, False], [28, False], [13, True]]},
        "voices": {},  # no segment named a voice (the default voice is not recorded)
        "torch_threads": torch.get_num_threads(),
        "waiting_streams": 0,
        "waiting_bytes": 0,
        "budget_waits": 0,
        "budget_refusals": 0,
    }
    stage.on_requests_finished(["a", "b"])  # a is live and freed; b ended already
    seen = json.loads(path.read_text())
    assert (seen["live_streams"], seen["streams_finished"], seen["forward_calls"]) == (0, 2, 6)
    assert sorted(p.name for p in path.parent.iterdir()) == ["stage.json"]  # atomic writes leave no temporaries


def test_seeds_and_chunks_name_each_request_by_its_engine_key_and_keep_the_latest_keys(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request's own seed is reported as sent; whole utterances are one `[tokens, true]`; old keys age out."""
    path = tmp_path / "stage.json"
    monkeypatch.setenv(envs.STAGE_STATS_ENV, str(path))
    monkeypatch.setattr(stats_module, "KEYS_KEPT", 2)
    stage = StepAudio2Token2WavForConditionalGeneration(model=str(model_dir), **FAST_OPTIONS)  # sync: whole utterances
    for key, info in (("r0-x", {"seed": 7}), ("r1-y", {}), ("r2-z", {"seed": 11})):
        out = stage(
            torch.tensor([100, 200, 300, 400], dtype=torch.int32),
            None,
            runtime_additional_information=[{"global_request_id": [key], "generated_len": 0, **info}],
            seq_token_counts=[4],
            request_ids=[key],
        )
        assert segment_errors(out.multimodal_outputs) == [None]
    seen = json.loads(path.read_text())
    assert seen["noise_seeds"] == {"r1-y": documented_seed("r1-y"), "r2-z": 11}
    assert seen["chunks"] == {"r1-y": [[4, True]], "r2-z": [[4, True]]}


def test_a_forward_call_that_raises_is_counted_with_its_error(
    stage: MiniCPMO45Code2Wav, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "stage.json"
    monkeypatch.setenv(envs.STAGE_STATS_ENV, str(path))
    with pytest.raises(ValueError, match="seq_token_counts"):
        stage(torch.zeros(3, dtype=torch.int32), None, runtime_additional_information=[{}], seq_token_counts=[2])
    seen = json.loads(path.read_text())
    assert seen["forward_calls"] == 1 and seen["segments"] == 0
    assert seen["last_error"].startswith("ValueError: seq_token_counts [2] must be >= 0 and sum to the 3 input ids")


def test_without_the_variable_a_call_costs_one_environment_lookup_and_keeps_no_counters(
    stage: MiniCPMO45Code2Wav, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(envs.STAGE_STATS_ENV, raising=False)
    lookups = []
    real = envs.stage_stats_path
    monkeypatch.setattr(envs, "stage_stats_path", lambda: lookups.append(1) or real())

    def no_write(*_: Any, **__: Any) -> None:
        raise AssertionError("no stats file may be written while the variable is unset")

    monkeypatch.setattr(stats_module, "write_json_atomic", no_write)
    chunks = all_chunks(ProducerStream("r", list(range(100, 160)), stage.family))
    _call(stage, ["r"])
    _call(stage, [chunks[0]])
    stage.on_requests_finished(["r"])
    assert len(lookups) == 3 and stage._stats.stats is None


def test_an_unwritable_stats_path_is_logged_once_and_never_fails_a_step(
    stage: MiniCPMO45Code2Wav, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(envs.STAGE_STATS_ENV, str(blocker / "stage.json"))  # its folder is a file
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert _call(stage, ["p"]) == [None]
    assert caplog.text.count(f"cannot write {envs.STAGE_STATS_ENV}={blocker / 'stage.json'}") == 1
    assert stage._stats.stats is not None and stage._stats.stats.forward_calls == 3


def test_an_interval_spaces_out_the_writes_of_forward_but_finishing_requests_always_writes(
    stage: MiniCPMO45Code2Wav, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "stage.json"
    monkeypatch.setenv(envs.STAGE_STATS_ENV, str(path))
    monkeypatch.setenv(envs.STAGE_STATS_INTERVAL_ENV, "3600")
    chunks = all_chunks(ProducerStream("r", list(range(100, 160)), stage.family))
    _call(stage, [chunks[0]])  # the first call writes
    _call(stage, [chunks[1]])  # within the interval: counted, not written
    assert json.loads(path.read_text())["steps_with_work"] == 1
    stage.on_requests_finished(["r"])  # always writes: the file is current once a request finished
    seen = json.loads(path.read_text())
    assert (seen["steps_with_work"], seen["live_streams"]) == (2, 0)
    monkeypatch.setenv(envs.STAGE_STATS_INTERVAL_ENV, "-1")
    with pytest.raises(ValueError, match="expected seconds >= 0"):
        envs.stage_stats_interval_s()


def test_voices_keep_the_first_voice_each_request_named() -> None:
    """`voices`: state key -> the voice key of the first segment naming one (later chunks carry none)."""
    from vllm_omni_token2wav.model_executor.models.token2wav_stage.contract import (
        ChunkMeta,
        Segment,
        SegmentKind,
        SegmentResult,
    )
    from vllm_omni_token2wav.model_executor.models.token2wav_stage.voice import VoiceRequest

    stats = stats_module.StageStats("cosyvoice3")
    voice = VoiceRequest(key="talker:abc", label="the talker's prompt conditioning (50 tokens)", source=object())
    first = Segment(0, "r-1", "r", SegmentKind.CHUNK, (1, 2, 3), ChunkMeta(None, None, False), voice)
    later = Segment(0, "r-1", "r", SegmentKind.CHUNK, (4, 5), ChunkMeta(None, None, True))
    other = Segment(1, "q-2", "q", SegmentKind.CHUNK, (6,), ChunkMeta(None, None, False))
    stats.record_step(
        [first, other], [SegmentResult(torch.zeros(1)), SegmentResult(torch.zeros(1))], profiling=False, live_streams=2
    )
    stats.record_step([later], [SegmentResult(torch.zeros(1))], profiling=False, live_streams=1)
    assert stats.voices == {"r-1": "talker:abc"}
