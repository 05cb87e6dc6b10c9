# SPDX-License-Identifier: Apache-2.0
"""The adapter: how one `forward` call of the runner becomes segments, and segment results become `OmniOutput`.

Every input here is written out by hand the way vLLM-Omni's runner and producers build it
(../shared/notes/stage-contract.md), so these tests pin the contract itself, not a helper's idea of it.
"""

from __future__ import annotations

import sys
import types
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch

from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav import MiniCPMO45Code2Wav
from vllm_omni_token2wav.model_executor.models.output_templates import OmniOutput
from vllm_omni_token2wav.model_executor.models.token2wav_stage.contract import (
    ChunkMeta,
    SegmentKind,
    SegmentResult,
    build_output,
    parse_step,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import (
    ERROR_KEY,
    decode_error,
    encode_error,
    segment_errors,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import MINICPMO_4_5, STEP_AUDIO2

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def _chunk(rid: str, seq: int, tokens: list[int], last: bool = False, **meta: object) -> dict:
    return {
        "codes": {"audio": torch.tensor(tokens)},
        "meta": {"request_id": rid, "chunk_seq": seq, "cache_epoch": 0, "last_chunk": last, **meta},
    }


def test_input_ids_are_split_by_seq_token_counts_in_order() -> None:
    ids = torch.arange(10, 19)
    infos = [{"meta": {"request_id": r, "chunk_seq": 0, "last_chunk": False}} for r in ("a", "b", "c")]
    step = parse_step(ids, infos, {"seq_token_counts": [4, 2, 3], "request_ids": ["A", "B", "C"]}, MINICPMO_4_5)
    assert [s.tokens for s in step.segments] == [(10, 11, 12, 13), (14, 15), (16, 17, 18)]
    assert [(s.index, s.key, s.request_id) for s in step.segments] == [(0, "A", "a"), (1, "B", "b"), (2, "C", "c")]
    assert all(s.kind is SegmentKind.CHUNK and s.chunk == ChunkMeta(0, None, False) for s in step.segments)


def test_codes_audio_wins_over_input_ids_and_code_flat_numel_is_the_true_count() -> None:
    ids = torch.tensor([0, 5, 6, 7])
    infos = [
        _chunk("a", 3, [], last=True, code_flat_numel=0),  # the runner's placeholder token for an empty chunk
        _chunk("b", 1, [5, 6, 7], code_flat_numel=3),
    ]
    infos[0]["codes"]["audio"] = torch.tensor([0])
    step = parse_step(ids, infos, {"seq_token_counts": [1, 3]}, MINICPMO_4_5)
    assert step.segments[0].tokens == () and step.segments[0].chunk == ChunkMeta(3, 0, True)
    assert step.segments[1].tokens == (5, 6, 7)
    infos[1]["meta"]["code_flat_numel"] = 5
    bad = parse_step(ids, infos, {"seq_token_counts": [1, 3]}, MINICPMO_4_5).segments[1]
    assert bad.error == "request b: meta.code_flat_numel says 5 tokens but the segment carries 3"


def test_flattened_meta_reads_like_nested_meta() -> None:
    ids = torch.tensor([1, 2, 3, 4, 5, 6, 7])
    nested = _chunk("r", 2, [1, 2, 3, 4, 5, 6, 7], last=True, code_flat_numel=7, seed=11)
    flat = {"codes.audio": nested["codes"]["audio"]} | {f"meta.{k}": v for k, v in nested["meta"].items()}
    flat["meta.chunk_seq"] = torch.tensor([2])  # tensors and 1-element lists are unwrapped
    flat["meta.last_chunk"] = [True]
    a = parse_step(ids, [nested], {"seq_token_counts": [7]}, MINICPMO_4_5).segments[0]
    b = parse_step(ids, [flat], {"seq_token_counts": [7]}, MINICPMO_4_5).segments[0]
    assert a == b and a.chunk == ChunkMeta(2, 0, True) and a.seed == 11 and a.key == "r"


def test_placeholder_steps_and_profiling_passes_are_empty() -> None:
    ids = torch.zeros(3, dtype=torch.long)
    stamped = [{"request_id": "a", "generated_len": 0, "meta": {}}, {"req_id": ["b"], "meta": {"request_id": "b"}}]
    step = parse_step(ids[:2], stamped, {"seq_token_counts": [1, 1]}, MINICPMO_4_5)
    assert not step.profiling and [s.kind for s in step.segments] == [SegmentKind.PLACEHOLDER] * 2
    for info, kwargs in ((None, {}), ([{}], {"dummy_run": True}), ([{}], {"is_profile": True})):
        prof = parse_step(ids, info, {"seq_token_counts": [3], **kwargs}, STEP_AUDIO2)
        assert prof.profiling and [s.kind for s in prof.segments] == [SegmentKind.PLACEHOLDER]
    assert parse_step(torch.empty(0, dtype=torch.long), None, {}, MINICPMO_4_5).profiling


def test_families_read_their_own_last_chunk_marker() -> None:
    ids = torch.tensor([1, 2, 3])
    # MiniCPM-o also sends left_context_size (the context it prepended): only last_chunk marks the end.
    mini = {"codes": {"audio": ids}, "meta": {"request_id": "m", "chunk_seq": 1, "left_context_size": 1}}
    assert parse_step(ids, [mini], {"seq_token_counts": [3]}, MINICPMO_4_5).segments[0].chunk.last is False  # type: ignore[union-attr]
    step2 = {"codes": {"audio": ids}, "meta": {"left_context_size": 1}}
    seg = parse_step(ids, [step2], {"seq_token_counts": [3], "request_ids": ["s"]}, STEP_AUDIO2).segments[0]
    assert seg.kind is SegmentKind.CHUNK and seg.chunk == ChunkMeta(None, None, True)
    step2["meta"]["left_context_size"] = torch.tensor(0)
    assert parse_step(ids, [step2], {"seq_token_counts": [3]}, STEP_AUDIO2).segments[0].chunk.last is False  # type: ignore[union-attr]


def test_a_payload_without_stream_meta_is_a_whole_utterance_or_a_one_chunk_stream() -> None:
    ids = torch.tensor([4, 5, 6])
    info = {"codes": {"audio": ids}}
    whole = parse_step(ids, [info], {"seq_token_counts": [3]}, STEP_AUDIO2).segments[0]
    assert whole.kind is SegmentKind.WHOLE and whole.tokens == (4, 5, 6)
    one = parse_step(ids, [info], {"seq_token_counts": [3]}, MINICPMO_4_5).segments[0]
    assert one.kind is SegmentKind.CHUNK and one.chunk == ChunkMeta(None, None, True)
    # Step-Audio2's sync mode: tokens in input_ids with only the runner's stamps.
    sync = parse_step(ids, [{}], {"seq_token_counts": [3]}, STEP_AUDIO2).segments[0]
    assert sync.kind is SegmentKind.WHOLE and sync.tokens == (4, 5, 6)
    zeros = parse_step(torch.zeros(3, dtype=torch.long), [{}], {"seq_token_counts": [3]}, STEP_AUDIO2).segments[0]
    assert zeros.kind is SegmentKind.PLACEHOLDER


def test_a_voice_comes_from_codes_ref_with_its_rate_or_prompt_wav(tmp_path: object) -> None:
    ids = torch.tensor([1, 2, 3])
    wav = np.linspace(-0.5, 0.5, 1600, dtype=np.float32)
    ref = _chunk("r", 0, [1, 2, 3], ref_audio_sr=16000)
    ref["codes"]["ref"] = torch.from_numpy(wav)
    seg = parse_step(ids, [ref], {"seq_token_counts": [3]}, MINICPMO_4_5).segments[0]
    assert seg.voice is not None and seg.voice.key.startswith("ref:") and seg.voice.source[1] == 16000
    same = parse_step(ids, [ref], {"seq_token_counts": [3]}, MINICPMO_4_5).segments[0]
    assert same.voice is not None and same.voice.key == seg.voice.key
    del ref["meta"]["ref_audio_sr"]
    missing = parse_step(ids, [ref], {"seq_token_counts": [3]}, MINICPMO_4_5).segments[0]
    assert missing.error is not None and "meta.ref_audio_sr is None" in missing.error
    path = _chunk("p", 0, [1, 2, 3], prompt_wav="/voices/alice.wav")
    by_path = parse_step(ids, [path], {"seq_token_counts": [3]}, MINICPMO_4_5).segments[0]
    assert by_path.voice is not None and by_path.voice.key == "path:/voices/alice.wav"


def test_unreadable_segments_fail_alone_and_contract_breaks_raise() -> None:
    ids = torch.tensor([1, 2, 3, 4])
    infos = ["not a dict", _chunk("ok", 0, [3, 4])]
    step = parse_step(ids, infos, {"seq_token_counts": [2, 2]}, MINICPMO_4_5)
    assert step.segments[0].error == "runtime_additional_information[0] is a str, expected a dict"
    assert step.segments[1].error is None
    floats = _chunk("f", 0, [1])
    floats["codes"]["audio"] = torch.tensor([1.0])
    assert "integer token ids" in str(
        parse_step(ids[:1], [floats], {"seq_token_counts": [1]}, MINICPMO_4_5).segments[0].error
    )
    with pytest.raises(ValueError, match=r"seq_token_counts \[2, 1\] must be >= 0 and sum to the 4 input ids"):
        parse_step(ids, infos, {"seq_token_counts": [2, 1]}, MINICPMO_4_5)
    with pytest.raises(ValueError, match="has 1 entries but the step has 2 segments"):
        parse_step(ids, infos[:1], {"seq_token_counts": [2, 2]}, MINICPMO_4_5)
    with pytest.raises(ValueError, match="request_ids names 1 requests"):
        parse_step(ids, infos, {"seq_token_counts": [2, 2], "request_ids": ["x"]}, MINICPMO_4_5)


def test_output_is_omni_output_shaped_in_input_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "vllm_omni", raising=False)  # the core alone: our own class
    audio = torch.arange(5, dtype=torch.float64).reshape(1, 5)
    out = build_output([SegmentResult(audio=audio), SegmentResult(error="request b: bad"), SegmentResult()], "cpu")
    assert isinstance(out, OmniOutput) and out._fields == (
        "text_hidden_states",
        "multimodal_outputs",
        "intermediate_tensors",
        "next_token_id",
    )
    mo = out.multimodal_outputs
    assert out.text_hidden_states is None and mo is not None
    assert [a.shape for a in mo["model_outputs"]] == [(5,), (0,), (0,)]
    assert all(a.dtype == torch.float32 for a in mo["model_outputs"])
    assert [int(r) for r in mo["sr"]] == [24000] * 3 and all(r.dtype == torch.int32 for r in mo["sr"])
    assert segment_errors(mo) == [None, "request b: bad", None]


def test_every_output_entry_is_a_tensor_the_runner_can_detach() -> None:
    """vLLM-Omni's runner calls `out[i].detach().to("cpu").contiguous()` on every entry of every list."""
    results = [SegmentResult(error="request ü: ß failed"), SegmentResult(audio=torch.ones(3)), SegmentResult()]
    mo = build_output(results, "cpu").multimodal_outputs
    assert set(mo) == {"model_outputs", "sr", ERROR_KEY} and ERROR_KEY == "token2wav_error"
    per_request = [{key: values[i].detach().to("cpu").contiguous() for key, values in mo.items()} for i in range(3)]
    errors = [p[ERROR_KEY] for p in per_request]
    assert all(e.dtype == torch.uint8 and e.dim() == 1 for e in errors)
    assert errors[0].tolist() == list("request ü: ß failed".encode())
    assert [e.numel() for e in errors[1:]] == [0, 0]


def test_error_messages_round_trip_through_uint8_tensors() -> None:
    assert encode_error(None).numel() == 0 and encode_error(None).dtype == torch.uint8
    assert decode_error(encode_error("request r: chunk_seq 3: expected 2")) == "request r: chunk_seq 3: expected 2"
    assert decode_error(None) is None and decode_error(torch.empty(0, dtype=torch.uint8)) is None
    with pytest.raises(ValueError, match="token2wav_error: expected a 1-D uint8 tensor of UTF-8 bytes, got dtype"):
        decode_error(torch.tensor([1.0]))


def test_the_output_class_is_upstreams_once_vllm_omni_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner checks `isinstance(out, vllm_omni...OmniOutput)`; any other class loses the audio."""

    class UpstreamOmniOutput(NamedTuple):
        text_hidden_states: Any
        multimodal_outputs: Any = None
        intermediate_tensors: Any = None
        next_token_id: Any = None

    names = ["vllm_omni", "vllm_omni.model_executor", "vllm_omni.model_executor.models"]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    templates = types.ModuleType("vllm_omni.model_executor.models.output_templates")
    templates.OmniOutput = UpstreamOmniOutput  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, templates.__name__, templates)
    out = build_output([SegmentResult(audio=torch.ones(2))], "cpu")
    assert type(out) is UpstreamOmniOutput and out.multimodal_outputs["model_outputs"][0].tolist() == [1.0, 1.0]
    ours = OmniOutput(None, {"model_outputs": []})
    assert type(MiniCPMO45Code2Wav.make_omni_output(None, ours)) is UpstreamOmniOutput  # type: ignore[arg-type]
    assert MiniCPMO45Code2Wav.make_omni_output(None, out) is out  # type: ignore[arg-type]
