# SPDX-License-Identifier: Apache-2.0
"""The stage models as the runner builds and calls them: config, laziness, dtype, weights, lifecycle.

A duck-typed `vllm_config` stands in for vLLM here (reading by attribute is the contract); the same
construction against a real `vllm.config.VllmConfig` is in `test_real_vllm_config.py`.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.token2wav import SessionCounter
from tests.model_executor.models.token2wav_stage.conftest import FAST_OPTIONS
from vllm_omni_token2wav.model_executor.models import audio as frontend
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav import MiniCPMO45Code2Wav
from vllm_omni_token2wav.model_executor.models.output_templates import OmniOutput
from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import ProducerStream, all_chunks, forward_inputs
from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav_stage import (
    StepAudio2Token2WavForConditionalGeneration,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import segment_errors
from vllm_omni_token2wav.model_executor.models.token2wav_stage.stage_model import Token2WavStageModel

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]

STAGES = (MiniCPMO45Code2Wav, StepAudio2Token2WavForConditionalGeneration)


def _config(model: Path | str, extra: dict[str, Any] | None = None, **hf: Any) -> SimpleNamespace:
    return SimpleNamespace(
        model_config=SimpleNamespace(
            model=str(model),
            hf_config=SimpleNamespace(**hf),
            stage_connector_config={
                "extra": {"token2wav_n_timesteps": 2, "ref_audio_max_seconds": 1.5, **(extra or {})}
            },
        ),
        device_config=SimpleNamespace(device=torch.device("cpu")),
        scheduler_config=SimpleNamespace(max_num_seqs=4),
        load_config=SimpleNamespace(load_format="dummy"),
    )


def _loaded(stage: Token2WavStageModel) -> bool:
    core = stage.token2wav
    return any(m is not None for m in (core._flow, core._hift, core._tokenizer))


def _step(stage: Token2WavStageModel, rid: str, tokens: list[int]) -> OmniOutput:
    chunks = all_chunks(ProducerStream(rid, tokens, stage.family))
    input_ids, kwargs = forward_inputs(chunks[:1], stage.family)
    return stage(input_ids, None, **kwargs)


@pytest.mark.parametrize("stage_cls", STAGES)
def test_construction_reads_the_config_checks_the_folder_and_loads_nothing(
    stage_cls: type[Token2WavStageModel], model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = SessionCounter(monkeypatch)
    stage = stage_cls(vllm_config=_config(model_dir, {"token2wav_max_streams": 3}), prefix="code2wav")
    assert stage.token2wav.model_path == model_dir / "token2wav" and stage.token2wav.device == torch.device("cpu")
    assert (stage.options.n_timesteps, stage.options.reference_seconds, stage.options.max_rows) == (2, 1.5, 4)
    assert stage.executor.config.max_streams == 3 and stage.options.load_format == "dummy"
    assert stage.default_voice == model_dir / "token2wav" / stage.family.default_voice_names[0]
    assert not _loaded(stage) and counter.count == 0 and list(stage.parameters()) == []
    for flag in (
        "have_multimodal_outputs",
        "enable_update_additional_information",
        "requires_raw_input_tokens",
        "requires_request_ids",
        "requires_exact_input_shape",
        "replace_runtime_additional_information",
    ):
        assert getattr(stage_cls, flag) is True, flag
    ids = torch.tensor([3, 4, 5])
    assert stage.embed_input_ids(ids).shape == (3, 1) and stage.compute_logits(ids) is None


def test_the_token2wav_folder_is_found_in_every_layout(tmp_path: Path, model_dir: Path) -> None:
    assets = model_dir / "token2wav"
    minicpmo = tmp_path / "MiniCPM-o" / "assets"
    minicpmo.mkdir(parents=True)
    (minicpmo / "token2wav").symlink_to(assets)
    shutil.copy(assets / "HT_ref_audio.wav", minicpmo / "HT_ref_audio.wav")
    stage = MiniCPMO45Code2Wav(vllm_config=_config(tmp_path / "MiniCPM-o"))
    assert stage.token2wav.model_path == minicpmo / "token2wav" and stage.default_voice == minicpmo / "HT_ref_audio.wav"
    itself = StepAudio2Token2WavForConditionalGeneration(vllm_config=_config(assets))
    assert itself.token2wav.model_path == assets
    explicit = StepAudio2Token2WavForConditionalGeneration(
        vllm_config=_config("/nowhere", token2wav_path=str(assets)), prompt_wav=str(assets / "default_female.wav")
    )
    assert explicit.token2wav.model_path == assets
    with pytest.raises(FileNotFoundError, match=r"no token2wav assets for model /nowhere: looked for flow\.yaml"):
        StepAudio2Token2WavForConditionalGeneration(vllm_config=_config("/nowhere"))
    with pytest.raises(ValueError, match="needs vllm_config.model_config.model"):
        MiniCPMO45Code2Wav()


def test_a_folder_without_a_default_voice_fails_at_construction(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in (model_dir / "token2wav").iterdir():
        if not f.name.endswith(".wav"):
            (bare / f.name).symlink_to(f)
    with pytest.raises(FileNotFoundError, match=r"step_audio2 token2wav stage: no default voice; looked for .*"):
        StepAudio2Token2WavForConditionalGeneration(vllm_config=_config(bare))
    with pytest.raises(FileNotFoundError, match=r"assets/HT_ref_audio\.wav.*prompt_wav=<file>"):
        MiniCPMO45Code2Wav(vllm_config=_config(bare))
    voice = tmp_path / "mine.wav"
    shutil.copy(model_dir / "token2wav" / "default_female.wav", voice)
    monkeypatch.setenv("STEP_AUDIO2_DEFAULT_PROMPT_WAV", str(voice))
    assert StepAudio2Token2WavForConditionalGeneration(vllm_config=_config(bare)).default_voice == voice


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"codec_left_context_frames": 2}, "codec_left_context_frames=2: the flow's pre-lookahead is 3 tokens"),
        ({"ref_audio_max_seconds": 30}, r"ref_audio_max_seconds must be in \[0.5, 16.0\]"),
        ({"token2wav_kv_cache_dtype": "int8"}, "token2wav_kv_cache_dtype must be one of"),
        ({"token2wav_n_timesteps": 0}, "token2wav_n_timesteps must be an int >= 1"),
    ],
)
def test_bad_stage_options_are_clear_errors(model_dir: Path, extra: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MiniCPMO45Code2Wav(vllm_config=_config(model_dir, extra))
    with pytest.raises(TypeError, match=r"unknown token2wav stage option\(s\) \['nope'\]"):
        MiniCPMO45Code2Wav(vllm_config=_config(model_dir), nope=1)


def test_async_chunk_is_read_from_vllm_omnis_model_config_and_absent_means_sync(model_dir: Path) -> None:
    config = _config(model_dir)
    assert MiniCPMO45Code2Wav(vllm_config=config).options.async_chunk is False  # a plain vLLM model config
    config.model_config.async_chunk = True
    assert MiniCPMO45Code2Wav(vllm_config=config).options.async_chunk is True
    assert MiniCPMO45Code2Wav(vllm_config=config, async_chunk=False).options.async_chunk is False


def test_additional_config_sets_stage_options_over_the_connector_extra_and_keywords_win(model_dir: Path) -> None:
    config = _config(model_dir, {"token2wav_seed": 5, "token2wav_max_streams": 7})
    config.additional_config = {"token2wav_seed": 9, "token2wav_stream_idle_timeout_s": 42}
    opts = MiniCPMO45Code2Wav(vllm_config=config).options
    assert (opts.seed, opts.max_streams, opts.idle_timeout_s) == (9, 7, 42.0)
    assert MiniCPMO45Code2Wav(vllm_config=config, seed=1).options.seed == 1
    config.additional_config = object()  # vLLM allows any hashable object there: not stage options
    assert MiniCPMO45Code2Wav(vllm_config=config).options.seed == 5
    config.additional_config = {"codec_left_context_frames": 2}
    with pytest.raises(ValueError, match="codec_left_context_frames=2"):
        MiniCPMO45Code2Wav(vllm_config=config)


def test_load_weights_drains_the_checkpoint_and_builds_the_models(model_dir: Path) -> None:
    stage = MiniCPMO45Code2Wav(model=str(model_dir), **FAST_OPTIONS)
    seen: list[int] = []
    weights = ((f"w{i}", torch.zeros(1)) for i in range(3) if not seen.append(i))
    assert stage.load_weights(weights) == set()
    assert seen == [0, 1, 2] and _loaded(stage)


def test_dummy_load_format_builds_the_models_on_the_first_real_step_only(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stage = MiniCPMO45Code2Wav(vllm_config=_config(model_dir))
    ids = torch.zeros(8, dtype=torch.long)
    for info in (None, [{"request_id": "a", "generated_len": 0, "meta": {}}]):  # profiling, then a placeholder step
        out = stage(ids, torch.arange(8), runtime_additional_information=info, seq_token_counts=[8], request_ids=["a"])
        assert [a.numel() for a in out.multimodal_outputs["model_outputs"]] == [0] and segment_errors(
            out.multimodal_outputs
        ) == [None]
        assert not _loaded(stage) and stage.live_streams == 0
    with caplog.at_level(logging.INFO):
        out = _step(stage, "r1", list(range(100, 140)))
    assert _loaded(stage) and "not built at weight loading (load_format=dummy)" in caplog.text
    assert out.multimodal_outputs["model_outputs"][0].numel() == 25 * 960 - 3840 and stage.live_streams == 1


def test_bf16_default_dtype_construction_and_serving_stay_fp32(model_dir: Path) -> None:
    reference = MiniCPMO45Code2Wav(model=str(model_dir), **FAST_OPTIONS)
    expected = _step(reference, "r", list(range(200, 260))).multimodal_outputs["model_outputs"][0]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # as vLLM's set_default_torch_dtype around model init and loading
    try:
        stage = MiniCPMO45Code2Wav(model=str(model_dir), **FAST_OPTIONS)
        assert not _loaded(stage)
        stage.load_weights([])
        audio = _step(stage, "r", list(range(200, 260))).multimodal_outputs["model_outputs"][0]
        assert torch.get_default_dtype() == torch.bfloat16
    finally:
        torch.set_default_dtype(previous)
    core = stage.token2wav
    assert {p.dtype for m in (core.flow, core.hift) for p in m.parameters()} == {torch.float32}
    assert audio.dtype == torch.float32 and torch.equal(audio, expected)


@pytest.mark.parametrize("stage_cls", STAGES)
def test_pre_warm_placeholders_of_an_async_chunk_pipeline_leave_the_request_to_its_first_chunk(
    stage_cls: type[Token2WavStageModel], model_dir: Path
) -> None:
    """The engine's pre-warm steps (one token, runner keys only) before the first codec window change nothing."""
    rid = "0_11d4e86b-5b1c-4a55-9a3e-6e0d1f7c2a90"
    warmed = stage_cls(model=str(model_dir), async_chunk=True, **FAST_OPTIONS)
    fresh = stage_cls(model=str(model_dir), async_chunk=True, **FAST_OPTIONS)
    stamps = {"global_request_id": [rid], "omni_final_stage_id": 0, "generated_len": 0}
    placeholder = stamps | {"request_id": rid, "meta": {"request_id": rid, "num_processed_tokens": 0}}
    for _ in range(2):
        out = warmed(
            torch.tensor([0], dtype=torch.int32),
            torch.arange(1),
            runtime_additional_information=[placeholder],
            seq_token_counts=[1],
            request_ids=[rid],
        ).multimodal_outputs
        assert out["model_outputs"][0].numel() == 0 and segment_errors(out) == [None]
    assert warmed.live_streams == 0
    for chunk in all_chunks(ProducerStream(rid, list(range(100, 160)), warmed.family)):
        input_ids, kwargs = forward_inputs([chunk], warmed.family)
        kwargs["runtime_additional_information"][0] |= stamps
        got = warmed(input_ids.to(torch.int32), None, **kwargs).multimodal_outputs
        want = fresh(input_ids, None, **kwargs).multimodal_outputs
        assert segment_errors(got) == segment_errors(want) == [None]
        assert torch.equal(got["model_outputs"][0], want["model_outputs"][0])
    assert warmed.live_streams == fresh.live_streams == 0


@pytest.mark.parametrize("stage_cls", STAGES)
def test_a_forward_call_shaped_as_the_real_engine_makes_it_serves_requests_without_a_producer(
    stage_cls: type[Token2WavStageModel], model_dir: Path
) -> None:
    """Two code2wav-alone requests in one step, every argument as vLLM-Omni 0.30's runner passed it."""
    rids = ["0_11d4e86b-5b1c-4a55-9a3e-6e0d1f7c2a90", "1_5293c0de-93aa-4f7e-8d0b-2b3c4d5e6f70"]
    tokens = [list(range(1000, 1040)), list(range(2000, 2060))]
    infos = [{"foo": [1], "global_request_id": [r], "omni_final_stage_id": 0, "generated_len": 0} for r in rids]

    def call(stage: Token2WavStageModel, which: list[int]) -> dict[str, Any]:
        counts = [len(tokens[i]) for i in which]
        spans = [[sum(counts[:k]), sum(counts[: k + 1])] for k in range(len(counts))]
        step_infos = [dict(infos[i]) for i in which]
        return stage(
            input_ids=torch.tensor([t for i in which for t in tokens[i]], dtype=torch.int32),
            positions=torch.cat([torch.arange(c, dtype=torch.int64) for c in counts]),
            intermediate_tensors=None,
            inputs_embeds=None,
            runtime_additional_information=step_infos,
            model_intermediate_buffer=step_infos,
            seq_token_counts=counts,
            request_ids=[rids[i] for i in which],
            request_token_spans=spans,
            sampling_metadata=None,
            logits_index=None,
            sampler=None,
        ).multimodal_outputs

    batched = stage_cls(vllm_config=_config(model_dir))  # a sync deployment: model_config has no async_chunk
    out = call(batched, [0, 1])
    assert segment_errors(out) == [None, None] and all(a.numel() > 0 for a in out["model_outputs"])
    assert batched.live_streams == 0  # whole utterances, or one-chunk streams that ended
    for i in (0, 1):  # each request's audio is its audio served alone (batched rows: <= 1e-5, the stage's bound)
        got, alone = out["model_outputs"][i], call(stage_cls(vllm_config=_config(model_dir)), [i])["model_outputs"][0]
        assert got.shape == alone.shape and float((got - alone).abs().max()) <= 1e-5


def test_on_requests_finished_frees_streams_and_the_last_chunk_ends_them(model_dir: Path) -> None:
    stage = MiniCPMO45Code2Wav(model=str(model_dir), **FAST_OPTIONS)
    chunks = {rid: all_chunks(ProducerStream(rid, list(range(300, 360)), stage.family)) for rid in ("a", "b", "c")}
    input_ids, kwargs = forward_inputs([c[0] for c in chunks.values()], stage.family)
    stage(input_ids, None, **kwargs)
    assert stage.live_streams == 3
    stage.on_requests_finished({"a", "zzz"})
    assert stage.live_streams == 2 and stage.streams.get("a") is None
    input_ids, kwargs = forward_inputs([c[0] for c in chunks.values()][:1], stage.family)
    assert segment_errors(stage(input_ids, None, **kwargs).multimodal_outputs) == [None]  # a finished id starts afresh
    rest = chunks["b"][1:]
    for chunk in rest:
        input_ids, kwargs = forward_inputs([chunk], stage.family)
        assert segment_errors(stage(input_ids, None, **kwargs).multimodal_outputs) == [None]
    assert stage.streams.get("b") is None and stage.live_streams == 2  # b ended at its last chunk
    input_ids, kwargs = forward_inputs([rest[-1]], stage.family)
    error = segment_errors(stage(input_ids, None, **kwargs).multimodal_outputs)[0]
    assert error is not None and "arrived after its stream had its last chunk" in error


def test_a_stream_over_max_streams_waits_abandoned_ones_are_evicted_and_a_late_chunk_says_so(
    model_dir: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage = MiniCPMO45Code2Wav(model=str(model_dir), max_streams=2, idle_timeout_s=30.0, **FAST_OPTIONS)
    assert stage.streams.max_streams is None and stage.executor.config.max_streams == 2
    now = [0.0]
    monkeypatch.setattr(stage.streams, "_clock", lambda: now[0])
    chunks = {rid: all_chunks(ProducerStream(rid, list(range(400, 460)), stage.family)) for rid in "abc"}
    with caplog.at_level(logging.WARNING):
        for rid in "abc":  # the third stream waits for admission: a live stream is never pushed out for it
            now[0] += 1
            input_ids, kwargs = forward_inputs([chunks[rid][0]], stage.family)
            out = stage(input_ids, None, **kwargs).multimodal_outputs
            assert segment_errors(out) == [None]
            assert (out["model_outputs"][0].numel() > 0) == (rid != "c"), rid
    assert stage.live_streams == 2 and stage.streams.get("a") is not None and "evicted" not in caplog.text
    assert stage.executor.memory_snapshot().waiting_streams == 1 and stage.executor.budget_waits == 1
    now[0] += 31  # a and b went quiet: the next step sweeps them, and c's held chunk runs before its next one
    with caplog.at_level(logging.WARNING):
        input_ids, kwargs = forward_inputs([chunks["c"][1]], stage.family)
        out = stage(input_ids, None, **kwargs).multimodal_outputs
    assert segment_errors(out) == [None] and out["model_outputs"][0].numel() > 0
    assert stage.live_streams == 1 and "stream of request b was evicted (idle 32 s > 30 s)" in caplog.text
    input_ids, kwargs = forward_inputs([chunks["a"][1]], stage.family)
    error = segment_errors(stage(input_ids, None, **kwargs).multimodal_outputs)[0]
    assert error is not None and "arrived after its stream was evicted (idle 33 s > 30 s)" in error


def test_idle_streams_are_swept_on_every_call_also_empty_profiling_and_placeholder_only_ones(
    model_dir: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage = MiniCPMO45Code2Wav(model=str(model_dir), idle_timeout_s=30.0, async_chunk=True, **FAST_OPTIONS)
    now = [0.0]
    monkeypatch.setattr(stage.streams, "_clock", lambda: now[0])
    no_work = {
        "an empty step": dict(runtime_additional_information=[], seq_token_counts=[], request_ids=[]),
        "a profiling pass": dict(runtime_additional_information=None, seq_token_counts=[1]),
        "a placeholder-only step": dict(
            runtime_additional_information=[{"global_request_id": ["p"], "generated_len": 0}],
            seq_token_counts=[1],
            request_ids=["p"],
        ),
    }
    for what, kwargs in no_work.items():
        rid = what.split()[-2]
        input_ids, first = forward_inputs(
            all_chunks(ProducerStream(rid, list(range(600, 660)), stage.family))[:1], stage.family
        )
        stage(input_ids, None, **first)
        assert stage.live_streams == 1, what
        now[0] += 31  # the request vanished: no last chunk, no finish notice
        ids = torch.zeros(sum(kwargs["seq_token_counts"]), dtype=torch.int32)
        with caplog.at_level(logging.WARNING):
            out = stage(ids, None, **kwargs)
        assert all(a.numel() == 0 for a in out.multimodal_outputs["model_outputs"]), what
        assert stage.live_streams == 0, what
        assert f"stream of request {rid} was evicted (idle 31 s > 30 s)" in caplog.text, what


def test_streams_hold_their_own_caches_and_share_their_voice_setup(model_dir: Path) -> None:
    stage = MiniCPMO45Code2Wav(model=str(model_dir), **FAST_OPTIONS)
    chunks = [all_chunks(ProducerStream(rid, list(range(500, 600)), stage.family)) for rid in ("a", "b")]
    for k in range(3):
        input_ids, kwargs = forward_inputs([c[k] for c in chunks], stage.family)
        stage(input_ids, None, **kwargs)
    usage = stage.executor.stream_bytes()
    a, b = (stage.streams.get(r) for r in ("a", "b"))
    assert a is not None and b is not None and a.voice is b.voice  # one prepared default voice
    kv = a.caches.flow.estimator_att  # type: ignore[attr-defined]
    assert kv.base is b.caches.flow.estimator_att.base  # type: ignore[attr-defined]
    prompt = a.caches.flow.prompt_frames  # type: ignore[attr-defined]
    assert kv.frames == prompt + 100 and kv.base_frames == min(prompt, 100)  # trimmed; the prompt's tail is shared
    flow, voc = a.caches.flow, a.caches.vocoder  # type: ignore[attr-defined]
    mine = [flow.conformer_cnn, flow.conformer_att, flow.estimator_cnn, kv.own, voc.mel, voc.source, voc.speech]
    own = sum(t.numel() * t.element_size() for t in mine) + voc.noise.state.numel()
    assert usage[0].own == own and usage[0].shared == kv.base_nbytes + flow.speaker.numel() * 4


def test_step_audio2_whole_utterance_matches_flow_then_hift_in_the_default_voice(model_dir: Path) -> None:
    """Independent reference: the prompt features of the normalised default voice, `flow.inference`, HiFT."""
    stage = StepAudio2Token2WavForConditionalGeneration(model=str(model_dir), **FAST_OPTIONS)
    tokens = [7, 6000, 1, 0, 4218, 33, 99]
    out = stage(
        torch.tensor(tokens), None, runtime_additional_information=[{}], seq_token_counts=[7], request_ids=["w"]
    )
    audio = out.multimodal_outputs["model_outputs"][0]
    core = stage.token2wav
    wav = frontend.load_audio(str(stage.default_voice), 24000, max_seconds=1.5, truncate=True).numpy()
    wav = np.concatenate([wav, np.zeros(36000 - wav.shape[0], dtype=np.float32)])[:36000]
    f = core.prepare_prompt((wav, 24000), with_tokens=True)
    with torch.inference_mode():
        mel = core.flow.inference(
            torch.tensor([tokens]), torch.tensor([7]), f.prompt_tokens, f.prompt_token_len,
            f.prompt_mel, f.prompt_mel_len, f.speaker_embedding, n_timesteps=2,
        )  # fmt: skip
        expected, _ = core.hift(mel, generator=torch.Generator().manual_seed(stage.executor.noise_seed("w", 0)))
    assert torch.equal(audio, expected.reshape(-1)) and stage.live_streams == 0
