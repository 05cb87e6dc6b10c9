# SPDX-License-Identifier: Apache-2.0
"""The adapter against what vLLM-Omni 0.30 really hands a code2wav stage (measured, and read from its code).

Every dict here is written out by hand in the shape the engine builds it:
- the runner adds `global_request_id` (a one-element list), `omni_final_stage_id` (an int) and
  `generated_len` to every request's dict (seen in a real run of a code2wav stage on CPU);
- an async-chunk pipeline schedules pre-warm placeholder steps (one token, runner keys only) before a
  request's first codec window;
- producers build their payloads in upstream's `stage_input_processors` (`minicpmo_4_5_omni.py`:
  `tts2code2wav_async_chunk` / `tts2code2wav_full_payload`; `step_audio2.py`:
  `thinker2token2wav_async_chunk` / `thinker2token2wav`; `cosyvoice3.py`: `talker2code2wav_async_chunk`
  / `text2flow_token_only` / `text2flow_full_payload`), travel nested or flattened (`meta.<key>`), and
  upstream's chunk adapter (`OmniChunkTransferAdapter._commit_received_chunk`) moves a 1-D `codes.audio`
  into the request's prompt (so into `input_ids`) and drops `meta.finished` before the stage sees it.
The expected segments come from the producers' own meaning (which tokens, which chunk, last or not),
not from the adapter's code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from vllm_omni_token2wav.model_executor.models.cosyvoice3.voice import ReferenceVoice
from vllm_omni_token2wav.model_executor.models.token2wav_stage.contract import (
    ChunkMeta,
    Segment,
    SegmentKind,
    carries_payload,
    parse_step,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import (
    COSYVOICE3,
    MINICPMO_4_5,
    STEP_AUDIO2,
    FamilySpec,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

FAMILIES = (MINICPMO_4_5, STEP_AUDIO2, COSYVOICE3)
RID = "0_11d4e86b-5b1c-4a55-9a3e-6e0d1f7c2a90"
SILENCE = 4218  # MiniCPM-o's first-chunk context code


def runner_stamps(rid: str = RID) -> dict[str, Any]:
    """What the engine adds to every request's dict (a real code2wav run on CPU)."""
    return {"global_request_id": [rid], "omni_final_stage_id": 0, "generated_len": 0}


def pre_warm(rid: str = RID) -> dict[str, Any]:
    """An async-chunk pre-warm placeholder's dict: runner keys only, a `meta` of bookkeeping."""
    meta = {"request_id": rid, "num_processed_tokens": 0, "resumable": True}
    return {**runner_stamps(rid), "request_id": rid, "req_id": [rid], "meta": meta}


def flatten(payload: dict[str, Any]) -> dict[str, Any]:
    """The flattened transport form: `{"meta": {"k": v}}` -> `{"meta.k": v}` for the payload sections."""
    flat: dict[str, Any] = {}
    for key, value in payload.items():
        if key in ("codes", "meta", "embed", "ids", "hidden_states") and isinstance(value, dict):
            flat |= {f"{key}.{k}": v for k, v in value.items()}
        else:
            flat[key] = value
    return flat


def through_chunk_adapter(payload: dict[str, Any]) -> dict[str, Any]:
    """The dict the stage gets for a chunk upstream's chunk adapter delivered: 1-D codes.audio moved to the
    prompt (the tokens arrive in `input_ids`), `meta.finished` dropped, empty sections left out."""
    out: dict[str, Any] = {}
    for key, value in payload.items():
        if key == "codes":
            rest = {k: v for k, v in value.items() if k != "audio"}
            if rest:
                out[key] = rest
        elif key == "meta":
            out[key] = {k: v for k, v in value.items() if k != "finished"}
        else:
            out[key] = value
    return out | {"generated_len": 0}


def one(
    family: FamilySpec,
    info: Any,
    ids: list[int],
    *,
    async_chunk: bool,
    request_ids: list[str] | None = None,
    dtype: torch.dtype = torch.int32,
) -> Segment:
    kwargs: dict[str, Any] = {"seq_token_counts": [len(ids)]}
    if request_ids is not None:
        kwargs["request_ids"] = request_ids
    step = parse_step(torch.tensor(ids, dtype=dtype), [info], kwargs, family, async_chunk=async_chunk)
    assert not step.profiling
    return step.segments[0]


# ---- placeholders --------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("token", [0, 1234])
def test_pre_warm_placeholders_of_an_async_chunk_pipeline_are_empty_for_every_family(
    family: FamilySpec, token: int
) -> None:
    for info in (pre_warm(), runner_stamps(), {**runner_stamps(), "meta": {}}, {}):
        assert not carries_payload(info)
        seg = one(family, info, [token], async_chunk=True, request_ids=[RID])
        assert (seg.kind, seg.error, seg.tokens, seg.key) == (SegmentKind.PLACEHOLDER, None, (), RID)


def test_keys_a_later_engine_adds_never_make_a_dict_payload() -> None:
    info = pre_warm() | {"omni_force_kv_transfer": True, "some_future_runner_key": [1], "meta.resumable": True}
    assert not carries_payload(info)
    seg = one(MINICPMO_4_5, info, [0], async_chunk=True)
    assert seg.kind is SegmentKind.PLACEHOLDER


def test_in_a_sync_deployment_only_empty_or_all_zero_tokens_without_payload_are_placeholders() -> None:
    for family in FAMILIES:
        assert one(family, runner_stamps(), [0, 0, 0], async_chunk=False).kind is SegmentKind.PLACEHOLDER
        step = parse_step(torch.empty(0, dtype=torch.int32), [runner_stamps()], {"seq_token_counts": [0]}, family)
        assert step.segments[0].kind is SegmentKind.PLACEHOLDER


# ---- MiniCPM-o 4.5: tts2code2wav_async_chunk / tts2code2wav_full_payload ----------------------------


def minicpmo_payload(
    seq: int, codes: list[int], *, new: int, last: bool, ref: torch.Tensor | None = None, sr: int | None = None
) -> dict[str, Any]:
    """`tts2code2wav_async_chunk`'s payload for a (non-duplex) request, None fields left out as `to_dict` does."""
    finished = torch.tensor(last, dtype=torch.bool)
    meta: dict[str, Any] = {
        "request_id": RID,
        "chunk_seq": seq,
        "cache_epoch": 0,
        "code_flat_numel": len(codes),
        "codec_chunk_frames": new,
        "codec_left_context_frames": 3,
        "left_context_size": 3,
        "last_chunk": last,
        "stream_finished": finished,
        "finished": finished,
        "is_segment_finished": finished,
        "req_id": [RID],
        "tts_is_last_chunk": last,
        "turn_end": False,
        "replace_runtime_additional_information": True,
    }
    if sr is not None:
        meta["ref_audio_sr"] = sr
    section: dict[str, Any] = {"audio": torch.tensor(codes, dtype=torch.long)}
    if ref is not None:
        section["ref"] = ref
    return {"codes": section, "meta": meta, "request_id": RID}


def test_minicpmo_async_chunk_payloads_are_stream_chunks_nested_flattened_and_after_the_adapter() -> None:
    ref = torch.linspace(-0.5, 0.5, 1600)
    first = [SILENCE] * 3 + list(range(100, 125))
    chunk0 = minicpmo_payload(0, first, new=25, last=False, ref=ref, sr=16000)
    chunk1 = minicpmo_payload(1, first[-3:] + list(range(125, 132)), new=7, last=True)
    for form in (lambda p: p, flatten, lambda p: flatten(p) | runner_stamps()):
        seg = one(MINICPMO_4_5, form(chunk0), [0] * 28, async_chunk=True, request_ids=[RID])
        assert (seg.kind, seg.error, seg.tokens) == (SegmentKind.CHUNK, None, tuple(first))
        assert seg.chunk == ChunkMeta(0, 0, False) and seg.key == RID and seg.request_id == RID
        assert seg.voice is not None and seg.voice.source[1] == 16000
        last = one(MINICPMO_4_5, form(chunk1), [0] * 10, async_chunk=True, request_ids=[RID])
        assert last.chunk == ChunkMeta(1, 0, True) and last.tokens == (*first[-3:], *range(125, 132))
    # After the chunk adapter: the codes arrive as input_ids, `finished` is gone, the ref stays in codes.
    adapted = through_chunk_adapter(chunk0)
    assert "audio" not in adapted["codes"] and "finished" not in adapted["meta"]
    seg = one(MINICPMO_4_5, adapted, first, async_chunk=True, request_ids=[RID])
    assert seg.kind is SegmentKind.CHUNK and seg.tokens == tuple(first) and seg.chunk == ChunkMeta(0, 0, False)
    assert seg.voice is not None and seg.voice.source[1] == 16000
    tail = minicpmo_payload(2, first[-3:], new=0, last=True)  # the last chunk: only the 3 context codes
    seg = one(MINICPMO_4_5, through_chunk_adapter(tail), first[-3:], async_chunk=True, request_ids=[RID])
    assert seg.chunk == ChunkMeta(2, 0, True) and seg.tokens == tuple(first[-3:])


def test_minicpmo_full_payload_of_a_sync_pipeline_is_a_one_chunk_stream_of_its_codes() -> None:
    codes = list(range(200, 240))
    payload = minicpmo_payload(0, [SILENCE] * 3 + codes, new=40, last=True)
    # tts2code2wav_token_only schedules len(codes) + 3 zero tokens; the codes come with the full payload.
    seg = one(MINICPMO_4_5, payload | runner_stamps(), [0] * 43, async_chunk=False, request_ids=[RID])
    assert seg.kind is SegmentKind.CHUNK and seg.chunk == ChunkMeta(0, 0, True)
    assert seg.tokens == (SILENCE,) * 3 + tuple(codes)


# ---- Step-Audio2: thinker2token2wav_async_chunk / thinker2token2wav --------------------------------


def step_audio2_payload(codes: list[int], last: bool) -> dict[str, Any]:
    """`thinker2token2wav_async_chunk`'s payload: codes, `left_context_size` 0/1 and `finished`."""
    meta = {"left_context_size": int(last), "finished": torch.tensor(last, dtype=torch.bool)}
    return {"codes": {"audio": torch.tensor(codes, dtype=torch.long)}, "meta": meta}


def test_step_audio2_async_chunk_payloads_are_stream_chunks_nested_flattened_and_after_the_adapter() -> None:
    window = list(range(10, 38))  # 25 + 3 lookahead
    for form in (lambda p: p, flatten, through_chunk_adapter):
        seg = one(STEP_AUDIO2, form(step_audio2_payload(window, False)), window, async_chunk=True, request_ids=[RID])
        assert (seg.kind, seg.error, seg.tokens) == (SegmentKind.CHUNK, None, tuple(window))
        assert seg.chunk == ChunkMeta(None, None, False)
        rest = list(range(35, 44))
        last = one(STEP_AUDIO2, form(step_audio2_payload(rest, True)), rest, async_chunk=True, request_ids=[RID])
        assert last.chunk == ChunkMeta(None, None, True) and last.tokens == tuple(rest)
    # A text-only reply ends with an empty EOF chunk (left_context_size 1, no codes).
    eof = step_audio2_payload([], True)
    seg = one(STEP_AUDIO2, eof, [], async_chunk=True, request_ids=[RID])
    assert seg.kind is SegmentKind.CHUNK and seg.tokens == () and seg.chunk == ChunkMeta(None, None, True)


def test_step_audio2_sync_path_tokens_with_runner_stamps_only_are_a_whole_utterance() -> None:
    tokens = [7, 6000, 1, 0, 4218, 33]  # thinker2token2wav: the prompt is the codes, no additional_information
    seg = one(STEP_AUDIO2, runner_stamps(), tokens, async_chunk=False, request_ids=[RID])
    assert (seg.kind, seg.tokens, seg.voice, seg.error) == (SegmentKind.WHOLE, tuple(tokens), None, None)


# ---- CosyVoice3: talker2code2wav_async_chunk / text2flow_token_only / text2flow_full_payload ---------


def cv3_conditioning(tokens: int = 12) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {
        "speech_token": torch.randint(0, 6561, (1, tokens), generator=g),
        "speech_feat": torch.randn(1, 2 * tokens, 80, generator=g),
        "embedding": torch.randn(1, 192, generator=g),
    }


def cosyvoice3_payload(prefix: list[int], offset: int, finished: bool, embed: dict | None = None) -> dict[str, Any]:
    """`talker2code2wav_async_chunk`'s payload: the whole prefix, `left_context_size` = where the new part starts."""
    flag = torch.tensor(finished, dtype=torch.bool)
    meta = {"finished": flag, "stream_finished": flag, "req_id": [RID], "left_context_size": offset}
    payload: dict[str, Any] = {"codes": {"audio": torch.tensor(prefix, dtype=torch.long)}, "meta": meta}
    return payload | ({"embed": embed} if embed else {})


def test_cosyvoice3_async_chunk_payloads_are_prefix_chunks_nested_flattened_and_after_the_adapter() -> None:
    embed = cv3_conditioning()
    prefix = list(range(50, 90))  # 37 + 3 lookahead (first hop padded to the prompt)
    for form in (lambda p: p, flatten, through_chunk_adapter):
        first = form(cosyvoice3_payload(prefix, 0, False, embed))
        seg = one(COSYVOICE3, first, prefix, async_chunk=True, request_ids=[RID])
        assert (seg.kind, seg.error, seg.tokens) == (SegmentKind.CHUNK, None, tuple(prefix))
        assert seg.chunk == ChunkMeta(None, None, False) and seg.voice is not None
        assert seg.voice.key.startswith("talker:")
        whole = list(range(50, 120))
        last = one(COSYVOICE3, form(cosyvoice3_payload(whole, 37, True)), whole, async_chunk=True, request_ids=[RID])
        assert last.chunk == ChunkMeta(None, None, True) and last.tokens == tuple(whole[37:]) and last.voice is None
    # A request that generated no token ends with an empty `finished` chunk (nested, as the talker sends it).
    terminal = {"codes": {"audio": torch.empty(0, dtype=torch.long)}, "meta": {"finished": torch.tensor(True)}}
    seg = one(COSYVOICE3, terminal | runner_stamps(), [], async_chunk=True, request_ids=[RID])
    assert seg.kind is SegmentKind.CHUNK and seg.tokens == () and seg.chunk == ChunkMeta(None, None, True)


def test_cosyvoice3_sync_payloads_are_a_whole_utterance_of_the_prompt_tokens() -> None:
    embed = cv3_conditioning()
    tokens = list(range(300, 340))
    token_only = {"embed": embed, "ids": {"prompt": [1, 2, 3]}} | runner_stamps()  # text2flow_token_only
    full = {"meta": {"finished": torch.tensor(True)}, "embed": embed} | runner_stamps()  # text2flow_full_payload
    for info in (token_only, full, flatten(full)):
        seg = one(COSYVOICE3, info, tokens, async_chunk=False, request_ids=[RID])
        assert (seg.kind, seg.tokens, seg.error) == (SegmentKind.WHOLE, tuple(tokens), None)
        assert seg.voice is not None and seg.voice.key.startswith("talker:")


# ---- requests without a producer (code2wav alone) --------------------------------------------------


def test_a_request_without_a_producer_is_its_whole_tokens_in_a_sync_deployment() -> None:
    info = {"foo": [1], **runner_stamps()}  # as a code2wav-alone request arrived in a real run
    tokens = list(range(40, 80))
    mini = one(MINICPMO_4_5, info, tokens, async_chunk=False, request_ids=[RID])
    assert mini.kind is SegmentKind.CHUNK and mini.chunk == ChunkMeta(None, None, True) and mini.tokens == tuple(tokens)
    for family in (STEP_AUDIO2, COSYVOICE3):
        seg = one(family, info, tokens, async_chunk=False, request_ids=[RID])
        assert (seg.kind, seg.tokens, seg.voice, seg.error) == (SegmentKind.WHOLE, tuple(tokens), None, None)


def test_the_request_key_is_request_ids_then_global_request_id_then_meta_request_id_then_the_index() -> None:
    info = {"global_request_id": ["g-1"], "meta": {"request_id": "m-1", "chunk_seq": 0}}
    assert one(MINICPMO_4_5, info, [5], async_chunk=True, request_ids=["r-1"]).key == "r-1"
    seg = one(MINICPMO_4_5, info, [5], async_chunk=True)
    assert (seg.key, seg.request_id) == ("g-1", "m-1")
    del info["global_request_id"]
    assert one(MINICPMO_4_5, info, [5], async_chunk=True).key == "m-1"
    assert one(MINICPMO_4_5, {"req_id": ["q-1"], "meta": {"chunk_seq": 0}}, [5], async_chunk=True).key == "q-1"
    assert one(MINICPMO_4_5, {"meta": {"chunk_seq": 0}}, [5], async_chunk=True).key == "0"
    gid = one(STEP_AUDIO2, runner_stamps("g-2"), [5], async_chunk=False)
    assert (gid.key, gid.request_id) == ("g-2", "g-2")


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_a_request_without_a_producer_names_its_voice_top_level(family: FamilySpec, tmp_path: Any) -> None:
    wav = np.linspace(-0.5, 0.5, 1600, dtype=np.float32)
    speech = {"speech_token": [[5, 6, 7, 8]]} if family is COSYVOICE3 else {}
    forms = [
        {"ref_audio": wav.tolist(), "ref_audio_sr": 16000},  # a list of floats arrives as a list
        {"ref_audio": [wav.tolist()], "ref_audio_sr": [16000]},  # wrapped in one-element lists
        {"ref_audio": torch.from_numpy(wav), "ref_audio_sr": 16000},
        {"ref_audio": [torch.from_numpy(wav)], "ref_audio_sr": torch.tensor(16000)},
    ]
    keys = set()
    for form in forms:
        info = form | speech | {"seed": [7]} | runner_stamps()
        assert carries_payload(info)
        seg = one(family, info, [0, 0, 0], async_chunk=False, request_ids=[RID])  # zeros: voice keys make it payload
        assert seg.error is None and seg.voice is not None and seg.seed == 7 and seg.tokens == (0, 0, 0)
        source = seg.voice.source.audio if isinstance(seg.voice.source, ReferenceVoice) else seg.voice.source
        np.testing.assert_array_equal(source[0], wav)
        assert source[1] == 16000
        keys.add(seg.voice.key)
    assert len(keys) == 1  # the same waveform in any wrapping is the same voice
    path = tmp_path / "alice.wav"
    path.write_bytes(b"RIFF")
    for prompt_wav in (str(path), [str(path)]):
        seg = one(family, {"prompt_wav": prompt_wav} | speech, [1, 2], async_chunk=False, request_ids=[RID])
        source = seg.voice.source.audio if isinstance(seg.voice.source, ReferenceVoice) else seg.voice.source
        assert seg.error is None and source == str(path)
    missing = one(family, {"ref_audio": wav.tolist()} | speech, [1, 2], async_chunk=False, request_ids=[RID])
    assert missing.error == f"request {RID}: ref_audio carries reference audio but ref_audio_sr is None; send its rate"
    a_path = one(family, {"ref_audio": str(path), "ref_audio_sr": 16000}, [1], async_chunk=False, request_ids=[RID])
    assert (
        a_path.error
        == f"request {RID}: ref_audio must be a waveform array or tensor, got str; pass a file path as prompt_wav"
    )


# ---- defects of the issue --------------------------------------------------------------------------


@pytest.mark.parametrize("meta", ["chunk_seq=0", [0, 1], 3])
@pytest.mark.parametrize("async_chunk", [True, False])
def test_a_meta_that_is_not_a_mapping_is_the_segments_error(meta: Any, async_chunk: bool) -> None:
    for family in FAMILIES:
        info = {"codes": {"audio": torch.tensor([5, 6, 7])}, "meta": meta} | runner_stamps()
        seg = one(family, info, [5, 6, 7], async_chunk=async_chunk, request_ids=[RID])
        assert seg.kind is SegmentKind.PLACEHOLDER and seg.chunk is None and seg.tokens == ()
        expected = f"request {RID}: meta is a {type(meta).__name__} ({meta!r}), expected a dict of stream fields"
        assert seg.error is not None and seg.error.startswith(expected), seg.error


def test_float_input_ids_are_rejected_like_float_codes_audio_and_int32_ids_are_accepted() -> None:
    info = runner_stamps()
    float_codes = {"codes": {"audio": torch.tensor([5.0, 6.0])}} | runner_stamps()
    by_codes = one(STEP_AUDIO2, float_codes, [5, 6], async_chunk=False, request_ids=[RID])
    by_ids = one(STEP_AUDIO2, info, [5, 6], async_chunk=False, request_ids=[RID], dtype=torch.float32)
    assert by_codes.error == f"request {RID}: codes.audio must hold integer token ids, got dtype torch.float32"
    assert by_ids.error == f"request {RID}: input_ids must hold integer token ids, got dtype torch.float32"
    mini = {"meta": {"chunk_seq": 0, "last_chunk": True}} | runner_stamps()
    assert "input_ids must hold integer token ids" in str(
        one(MINICPMO_4_5, mini, [5, 6], async_chunk=True, dtype=torch.float64).error
    )
    assert one(STEP_AUDIO2, info, [5, 6], async_chunk=False, dtype=torch.bool).error is not None
    for dtype in (torch.int32, torch.int64, torch.int16):
        seg = one(STEP_AUDIO2, info, [5, 6000], async_chunk=False, dtype=dtype)
        assert (seg.error, seg.tokens) == (None, (5, 6000))
    # codes.audio wins: float ids beside integer codes are not this segment's tokens
    with_codes = {"codes": {"audio": torch.tensor([5, 6])}} | runner_stamps()
    assert one(STEP_AUDIO2, with_codes, [0, 0], async_chunk=False, dtype=torch.float32).error is None
