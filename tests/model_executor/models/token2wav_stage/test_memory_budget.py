# SPDX-License-Identifier: Apache-2.0
"""The stage's memory budget: option parsing, the auto default, waiting for admission, refusals, stats.

The executor tests run over `test_step_executor.FakeBackend`, whose stream holds one byte per token
received (`stream_bytes` = the tokens seen) and whose audio is the chunk's tokens: a held chunk that
was lost, run twice or out of order shows up as a wrong number. Budgets are in those bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from tests.model_executor.models.token2wav_stage.conftest import FAST_OPTIONS
from tests.model_executor.models.token2wav_stage.test_step_executor import VOICE, FakeBackend
from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_code2wav import CosyVoice3Code2Wav
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav import MiniCPMO45Code2Wav
from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import (
    ChunkPayload,
    ProducerStream,
    all_chunks,
    forward_inputs,
)
from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav_stage import (
    StepAudio2Token2WavForConditionalGeneration,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.contract import (
    ChunkMeta,
    Segment,
    SegmentKind,
    SegmentResult,
    parse_step,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import segment_errors
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import COSYVOICE3
from vllm_omni_token2wav.model_executor.models.token2wav_stage.memory_budget import (
    AUTO_SHARE,
    auto_memory_budget,
    host_available_bytes,
    parse_memory_budget,
    resolve_memory_budget,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.options import stage_options
from vllm_omni_token2wav.model_executor.models.token2wav_stage.stats import StageStats
from vllm_omni_token2wav.model_executor.models.token2wav_stage.step_executor import (
    StepExecutorConfig,
    Token2WavStepExecutor,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.store import StreamStore
from vllm_omni_token2wav.platforms.cpu.platform import CpuDevicePlatform

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def executor(budget: int | None, per_token: float = 0.0) -> Token2WavStepExecutor:
    engine = Token2WavStepExecutor(
        FakeBackend(),
        StreamStore(max_streams=16),
        VOICE,
        StepExecutorConfig(reference_seconds=1.0, memory_budget=budget),
    )
    engine.bytes_model.per_token = per_token
    return engine


def chunk(i: int, rid: str, seq: int, tokens: Sequence[int], last: bool = False) -> Segment:
    return Segment(i, rid, rid, SegmentKind.CHUNK, tuple(tokens), ChunkMeta(seq, None, last))


def audio(result: SegmentResult) -> list[float]:
    assert result.error is None, result.error
    return [] if result.audio is None else result.audio.tolist()


# ---- the option ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("auto", None),
        (" AUTO ", None),
        ("off", 0),
        (0, 0),
        (123, 123),
        (2.5e9, 2_500_000_000),
        ("8GiB", 8 * 2**30),
        ("500 MB", 500_000_000),
        ("1.5kib", 1536),
        ("4096", 4096),
    ],
)
def test_the_budget_option_reads_bytes_units_auto_and_off(value: object, expected: int | None) -> None:
    assert parse_memory_budget(value) == expected


@pytest.mark.parametrize("value", [True, -1, "lots", "8 parsecs", [8], float("nan")])
def test_a_malformed_budget_names_the_key_what_it_expects_and_what_it_got(value: object) -> None:
    with pytest.raises(ValueError, match=r"token2wav_memory_budget must be a positive number of bytes") as info:
        parse_memory_budget(value)
    assert repr(value) in str(info.value)


def test_the_stage_option_comes_from_additional_config_and_is_checked_at_construction() -> None:
    class Config:
        additional_config = {"token2wav_memory_budget": "2GB"}

    assert stage_options(Config(), {}).memory_budget == 2 * 10**9
    assert stage_options(object(), {}).memory_budget is None  # auto, the default
    Config.additional_config = {"token2wav_memory_budget": "two gigs"}
    with pytest.raises(ValueError, match="token2wav_memory_budget .* got 'two gigs'"):
        stage_options(Config(), {})


def test_auto_takes_a_fixed_share_of_free_device_memory_or_of_available_ram() -> None:
    class Device:
        def free_memory(self, device: torch.device) -> int:
            assert device.type == "cuda"
            return 10_000

    assert auto_memory_budget(torch.device("cuda", 0), Device()) == int(10_000 * AUTO_SHARE)
    ram = host_available_bytes()
    assert ram is not None and ram > 0  # Linux CI: /proc/meminfo
    cpu = auto_memory_budget(torch.device("cpu"), Device())  # never asks the device object on CPU
    assert cpu is not None and abs(cpu - ram * AUTO_SHARE) < 0.2 * ram  # RAM moves a little between the reads
    assert resolve_memory_budget(0, torch.device("cpu"), Device()) is None  # off: no budget
    assert CpuDevicePlatform().free_memory() is None  # the CPU platform leaves host memory to the caller
    assert resolve_memory_budget(77, torch.device("cpu"), Device()) == 77

    class Unknown:
        def free_memory(self, device: torch.device) -> None:
            return None

    assert auto_memory_budget(torch.device("cuda", 0), Unknown()) is None  # never host RAM for a device's streams


def test_a_device_runtime_that_cannot_answer_gives_no_figure_instead_of_failing_the_stage() -> None:
    from vllm_omni_token2wav.platforms.interface import DevicePlatform

    class Broken:
        @staticmethod
        def mem_get_info(device: object) -> tuple[int, int]:
            raise AssertionError("Torch not compiled with CUDA enabled")

    class Platform(DevicePlatform):
        def device_module(self) -> object:
            return Broken()

        def is_cpu(self) -> bool:
            return False

    platform = Platform.__new__(Platform)
    assert platform.free_memory(torch.device("cuda", 0)) is None


# ---- waiting for admission ----------------------------------------------------------------------


def test_a_stream_that_does_not_fit_waits_and_runs_once_another_finishes_with_its_solo_audio() -> None:
    engine = executor(budget=8)
    out = engine.step([chunk(0, "a", 0, [1, 2, 3, 4])])
    assert audio(out[0]) == [1, 2, 3, 4] and engine.bytes_model.per_token == 1.0  # measured: 4 bytes / 4 tokens
    out = engine.step([chunk(0, "a", 1, [5, 6]), chunk(1, "b", 0, [7, 8, 9, 10, 11])])  # a holds 6, b needs 5
    assert audio(out[0]) == [5, 6] and out[1].error is None and out[1].audio is None  # b waits, no error
    assert engine.store.get("b") is None and engine.memory_snapshot().waiting_streams == 1
    out = engine.step([chunk(0, "b", 1, [12]), chunk(1, "a", 2, [13], last=True)])
    assert out[0].audio is None and audio(out[1]) == [13]  # b still waits (a's stream was live at the step's start)
    assert engine.memory_snapshot().waiting_bytes == 6
    out = engine.step([chunk(0, "b", 2, [14, 15])])  # a ended: b's three held chunks run now, in order
    assert audio(out[0]) == [7, 8, 9, 10, 11, 12, 14, 15]
    out = engine.step([chunk(0, "b", 3, [16], last=True)])
    assert audio(out[0]) == [16] and len(engine.store) == 0

    alone = executor(budget=None)
    solo = [
        alone.step([chunk(0, "b", i, t, last=i == 3)])[0]
        for i, t in enumerate([[7, 8, 9, 10, 11], [12], [14, 15], [16]])
    ]
    assert sum((audio(r) for r in solo), []) == [7, 8, 9, 10, 11, 12, 14, 15, 16]
    assert engine.budget_waits == 1 and engine.budget_refusals == 0


def test_waiting_streams_are_admitted_in_arrival_order() -> None:
    engine = executor(budget=6, per_token=1.0)
    engine.step([chunk(0, "a", 0, [1, 2, 3, 4, 5])])
    engine.step([chunk(0, "b", 0, [6, 7, 8]), chunk(1, "c", 0, [9])])  # b needs 3, c 1: both wait behind a
    snap = engine.memory_snapshot()
    assert (snap.waiting_streams, snap.waiting_bytes, snap.live_bytes) == (2, 4, 5)
    engine.finish(["a"])
    out = engine.step([chunk(0, "c", 1, [10])])  # c fits only after b's reservation: 0 + 3 + 2 <= 6
    assert audio(out[0]) == [9, 10]
    out = engine.step([chunk(0, "b", 1, [11])])
    assert audio(out[0]) == [6, 7, 8, 11]


def test_a_stream_that_can_never_fit_fails_alone_naming_its_tokens_and_the_budget() -> None:
    engine = executor(budget=8, per_token=1.0)
    out = engine.step([chunk(0, "big", 0, list(range(9))), chunk(1, "ok", 0, [1, 2])])
    assert out[0].error is not None and out[0].audio is None
    assert "request big: 9 tokens need about 9 bytes" in out[0].error
    assert "token2wav_memory_budget=8 bytes: it can never run" in out[0].error
    assert audio(out[1]) == [1, 2] and engine.store.get("big") is None and engine.budget_refusals == 1
    whole = Segment(0, "w", "w", SegmentKind.WHOLE, tuple(range(20)))
    assert "request w: 20 tokens need about 20 bytes" in (engine.step([whole])[0].error or "")


def test_a_waiting_stream_whose_last_chunk_comes_before_memory_is_free_fails_with_the_figures() -> None:
    engine = executor(budget=6, per_token=1.0)
    engine.step([chunk(0, "a", 0, [1, 2, 3, 4, 5])])
    engine.step([chunk(0, "b", 0, [6, 7])])
    out = engine.step([chunk(0, "b", 1, [8], last=True), chunk(1, "a", 1, [9])])
    assert audio(out[1]) == [9]
    assert out[0].error is not None and "waited for memory, and its last chunk arrived" in out[0].error
    assert "needs about 3 bytes for 3 tokens" in out[0].error and "token2wav_memory_budget=6" in out[0].error
    assert engine.memory_snapshot().waiting_streams == 0


def test_without_a_budget_nothing_waits_and_nothing_is_measured() -> None:
    engine = executor(budget=None)
    out = engine.step([chunk(0, "a", 0, list(range(50))), chunk(1, "b", 0, list(range(50)))])
    assert all(r.error is None and r.audio is not None for r in out)
    assert engine.bytes_model.per_token == 0.0 and engine.memory_snapshot().budget_bytes is None


def test_the_stage_stats_report_the_budget_and_what_waits() -> None:
    engine = executor(budget=6, per_token=1.0)
    engine.step([chunk(0, "a", 0, [1, 2, 3, 4, 5])])
    segments = [chunk(0, "b", 0, [6, 7])]
    results = engine.step(segments)
    stats = StageStats("fake")
    stats.record_step(segments, results, profiling=False, live_streams=len(engine.store))
    stats.record_memory(engine.memory_snapshot(), waits=engine.budget_waits, refusals=engine.budget_refusals)
    assert stats.memory_budget_bytes == 6 and stats.live_stream_bytes == 5
    assert (stats.waiting_streams, stats.waiting_bytes, stats.budget_waits, stats.budget_refusals) == (1, 2, 1, 0)


# ---- CosyVoice3 on the reduced stand-in ---------------------------------------------------------


KV_DTYPES = {None: torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cosyvoice3_stage(cv3_dir: Path, budget: object, **options: object) -> CosyVoice3Code2Wav:
    stage = CosyVoice3Code2Wav(model=str(cv3_dir), device="cpu", n_timesteps=2, memory_budget=budget, **options)
    stage.load_weights([])
    return stage


def cosyvoice3_chunks(stage: CosyVoice3Code2Wav, rid: str, count: int, seed: int) -> list[ChunkPayload]:
    tokens = torch.randint(0, 6561, (count,), generator=torch.Generator().manual_seed(seed)).tolist()
    prompt = stage.default_voice.tokens.shape[1]
    return all_chunks(ProducerStream(rid, tokens, COSYVOICE3, prompt_tokens=prompt))


def serve(stage: CosyVoice3Code2Wav, payloads: list[ChunkPayload]) -> tuple[list[torch.Tensor], list[str | None]]:
    input_ids, kwargs = forward_inputs(payloads, stage.family)
    out = stage(input_ids, None, **kwargs).multimodal_outputs
    return out[COSYVOICE3.output_key], segment_errors(out)


def tokens_of(stage: CosyVoice3Code2Wav, payload: ChunkPayload) -> int:
    """The tokens the executor counts for a payload (its segment as the stage parses it)."""
    input_ids, kwargs = forward_inputs([payload], stage.family)
    info = kwargs.pop("runtime_additional_information")
    (segment,) = parse_step(input_ids, info, kwargs, stage.family, async_chunk=stage.options.async_chunk).segments
    return len(segment.tokens)


KV_ELEMENT = {None: 4, "float32": 4, "bfloat16": 2, "float16": 2}


@pytest.mark.usefixtures("cpu_platform")
@pytest.mark.parametrize("kv_dtype", [None, "bfloat16", "float16"])
def test_cosyvoice3s_estimate_matches_the_bytes_its_streams_hold_in_each_kv_dtype(
    cv3_dir: Path, kv_dtype: str | None
) -> None:
    """The admission estimate vs `stream_bytes` after every chunk of a stream, in each K/V storage dtype."""
    stage = cosyvoice3_stage(cv3_dir, "off", kv_cache_dtype=kv_dtype)
    backend = stage.backend
    _, voice = stage.executor.voice(None)
    config = backend.core.flow.config
    prompt = int(voice.prompt.tokens.shape[-1])
    per_frame = 2 * 2 * 2 * config.depth * config.heads * config.dim_head * KV_ELEMENT[kv_dtype]
    assert backend.bytes_per_frame == per_frame
    small = backend.estimate_stream_bytes(voice, 0) - prompt * config.token_mel_ratio * per_frame
    for payload in cosyvoice3_chunks(stage, "r", 180, seed=1)[:-1]:  # the last chunk ends the stream
        _, errors = serve(stage, [payload])
        assert errors == [None], errors
        (state,) = stage.streams.states()
        arena = state.caches.flow.kv
        # measured: the arena's bytes per mel frame are exactly the estimate's (3.6 MB at full size in fp32)
        assert arena.keys.dtype == KV_DTYPES[kv_dtype] and arena.nbytes == arena.capacity * per_frame
        # and everything else the stream holds is within the estimate's constant part
        rest = backend.stream_bytes(state.caches, state.voice).own - arena.nbytes
        assert 0 < rest <= small, (rest, small)


@pytest.mark.usefixtures("cpu_platform")
@pytest.mark.parametrize("kv_dtype", [None, "bfloat16"])
def test_a_cosyvoice3_reservation_bounds_the_arena_at_every_chunk(cv3_dir: Path, kv_dtype: str | None) -> None:
    """Under a budget the arena doubles only up to the stream's reservation: own bytes <= the reserved estimate."""
    stage = cosyvoice3_stage(cv3_dir, "1GiB", kv_cache_dtype=kv_dtype, reserve_seconds=3.0)
    backend, engine = stage.backend, stage.executor
    _, voice = engine.voice(None)
    held, counted = [], []
    for payload in cosyvoice3_chunks(stage, "r", 180, seed=1)[:-1]:
        _, errors = serve(stage, [payload])
        assert errors == [None], errors
        (state,) = stage.streams.states()
        own = backend.stream_bytes(state.caches, state.voice).own
        reserved = engine._reserved["r"]
        assert reserved >= state.tokens and reserved >= 75  # 3 s x 25 tokens, then grown with the stream
        held.append(own)
        counted.append(backend.estimate_stream_bytes(voice, reserved))
        assert own <= counted[-1], (own, counted[-1], state.tokens, reserved)
    shared = voice.prompt.nbytes  # the voice's prompt, counted once beside the stream's own bytes
    assert engine.live_bytes() == counted[-1] + shared and engine.budget_waits == 0
    assert held[-1] >= 0.5 * counted[-1], (held, counted)  # the reservation is not wildly above what it holds


@pytest.mark.usefixtures("cpu_platform")
@pytest.mark.parametrize(("kv_dtype", "bound"), [("bfloat16", 0.1), ("float16", 0.02)])
def test_a_reduced_kv_dtype_stays_close_to_fp32_audio(cv3_dir: Path, kv_dtype: str, bound: float) -> None:
    """bf16 / fp16 K/V storage (attention still in fp32): half the bytes, audio near fp32's (relative L2
    measured on the reduced stand-in, 120 tokens: bf16 5.4e-2, fp16 7.0e-3)."""
    audio = {}
    for dtype in (None, kv_dtype):
        stage = cosyvoice3_stage(cv3_dir, "off", kv_cache_dtype=dtype)
        parts = []
        for payload in cosyvoice3_chunks(stage, "r", 120, seed=4):
            out, errors = serve(stage, [payload])
            assert errors == [None], errors
            parts.append(out[0])
        audio[dtype] = torch.cat(parts)
    ref, reduced = audio[None], audio[kv_dtype]
    assert ref.shape == reduced.shape and ref.abs().max() > 0
    relative = float((reduced - ref).norm() / ref.norm())
    print(f"kv {kv_dtype}: relative L2 {relative:.2e}, max abs {float((reduced - ref).abs().max()):.2e}")
    assert 0 < relative < bound, relative  # rounded K/V change the audio a little, not its content


@pytest.mark.usefixtures("cpu_platform")
def test_a_cosyvoice3_stream_over_the_budget_waits_and_then_gives_its_solo_audio(cv3_dir: Path) -> None:
    alone = cosyvoice3_stage(cv3_dir, "off")
    b_chunks = cosyvoice3_chunks(alone, "b", 90, seed=3)
    solo = []
    for payload in b_chunks:
        audio, errors = serve(alone, [payload])
        assert errors == [None], errors
        solo.append(audio[0])
    _, voice = alone.executor.voice(None)
    need_b = alone.backend.estimate_stream_bytes(voice, sum(tokens_of(alone, p) for p in b_chunks))
    budget = need_b + 1  # b fits alone ...
    stage = cosyvoice3_stage(cv3_dir, budget)
    a_chunks = cosyvoice3_chunks(stage, "a", 30, seed=2)
    audio, errors = serve(stage, [a_chunks[0], b_chunks[0]])
    assert errors == [None, None] and audio[0].numel() > 0 and audio[1].numel() == 0  # ... but not beside a
    assert stage.executor.memory_snapshot().waiting_streams == 1
    served = [audio[1]]
    steps = max(len(a_chunks), len(b_chunks))
    for k in range(1, steps + 1):
        payloads = ([a_chunks[k]] if k < len(a_chunks) else []) + ([b_chunks[k]] if k < len(b_chunks) else [])
        if not payloads:
            break
        audio, errors = serve(stage, payloads)
        assert errors == [None] * len(payloads), errors
        if k < len(b_chunks):
            served.append(audio[-1])
    torch.testing.assert_close(torch.cat(served), torch.cat(solo), rtol=0, atol=1e-6)
    assert stage.executor.budget_waits == 1 and stage.executor.budget_refusals == 0


def test_a_one_chunk_stream_runs_beside_others_unless_it_could_never_fit() -> None:
    """A one-chunk stream (MiniCPM-o's sync path) ends in its step: it cannot wait, and holds nothing after it."""
    engine = executor(budget=6, per_token=1.0)
    engine.step([chunk(0, "a", 0, [1, 2, 3, 4, 5])])
    out = engine.step([chunk(0, "once", 0, [6, 7, 8], last=True), chunk(1, "never", 0, list(range(7)), last=True)])
    assert audio(out[0]) == [6, 7, 8] and engine.memory_snapshot().waiting_streams == 0
    assert out[1].error is not None and "it can never run on this stage" in out[1].error


# ---- the CosyVoice2 flow (MiniCPM-o 4.5, Step-Audio2) on the reduced stand-in --------------------


@pytest.mark.parametrize("kv_dtype", [None, "bfloat16"])
def test_a_cosyvoice2_streams_reservation_bounds_what_it_holds_at_every_chunk(model_dir: Path, kv_dtype: str) -> None:
    """The trimmed cache is bounded: the admission estimate is the bound, and a long stream reaches it."""
    stage = MiniCPMO45Code2Wav(model=str(model_dir), async_chunk=True, kv_cache_dtype=kv_dtype, **FAST_OPTIONS)
    stage.load_weights([])
    _, voice = stage.executor.voice(None)
    reserved = stage.backend.estimate_stream_bytes(voice, 0)
    held = []
    tokens = torch.randint(0, 6561, (200,), generator=torch.Generator().manual_seed(5)).tolist()
    for payload in all_chunks(ProducerStream("r", tokens, stage.family))[:-1]:
        input_ids, kwargs = forward_inputs([payload], stage.family)
        errors = segment_errors(stage(input_ids, None, **kwargs).multimodal_outputs)
        assert errors == [None], errors
        (state,) = stage.streams.states()
        held.append(stage.backend.stream_bytes(state.caches, state.voice).own)
        assert stage.backend.estimate_stream_bytes(voice, state.tokens) == reserved  # bounded: independent of length
    assert max(held) <= reserved and held[-1] >= 0.9 * reserved, (held, reserved)


def test_a_step_audio2_streams_estimate_grows_with_its_untrimmed_conformer_cache(model_dir: Path) -> None:
    """Step-Audio2 keeps its conformer cache whole: what a stream holds grows, and the estimate with it."""
    stage = StepAudio2Token2WavForConditionalGeneration(model=str(model_dir), **FAST_OPTIONS)
    stage.load_weights([])
    _, voice = stage.executor.voice(None)
    held, estimated = [], []
    tokens = torch.randint(0, 6561, (300,), generator=torch.Generator().manual_seed(5)).tolist()
    for payload in all_chunks(ProducerStream("r", tokens, stage.family))[:-1]:
        input_ids, kwargs = forward_inputs([payload], stage.family)
        errors = segment_errors(stage(input_ids, None, **kwargs).multimodal_outputs)
        assert errors == [None], errors
        (state,) = stage.streams.states()
        held.append(stage.backend.stream_bytes(state.caches, state.voice).own)
        estimated.append(stage.backend.estimate_stream_bytes(voice, state.tokens))
    assert all(h <= e for h, e in zip(held, estimated, strict=True)), (held, estimated)
    assert held[-1] > 1.2 * held[2] and held[-1] >= 0.8 * estimated[-1], (held, estimated)  # it grows, tracked


def test_a_waiting_request_that_goes_silent_is_dropped_after_the_idle_timeout() -> None:
    """A request that vanished without a finish notice must not hold its reservation (and the queue) forever."""
    engine = executor(budget=6, per_token=1.0)
    now = [0.0]
    engine.clock = lambda: now[0]
    engine.step([chunk(0, "a", 0, [1, 2, 3, 4, 5])])
    engine.step([chunk(0, "gone", 0, [6, 7, 8])])
    assert engine.memory_snapshot().waiting_streams == 1
    engine.finish(["a"])
    now[0] = engine.store.idle_timeout_s + 1
    out = engine.step([chunk(0, "c", 0, [9, 10, 11, 12, 13])])  # fits only without gone's reservation of 3
    assert audio(out[0]) == [9, 10, 11, 12, 13] and engine.memory_snapshot().waiting_streams == 0


# ---- streams that grow (CosyVoice3's exact K/V): reservations and growth under the budget ---------


class GrowingBackend(FakeBackend):
    """FakeBackend whose streams are estimated like CosyVoice3's: one byte per token received, growing."""

    def estimate_stream_bytes(self, voice: object, tokens: int) -> int:
        return max(int(tokens), 0)

    def reserve_stream(self, caches: object, tokens: int) -> object:
        self.reserved.append(tokens)
        return caches

    @property
    def reserved(self) -> list[int]:
        if not hasattr(self, "_reserved"):
            self._reserved: list[int] = []
        return self._reserved


def growing(budget: int, reserve_tokens: int = 0) -> Token2WavStepExecutor:
    return Token2WavStepExecutor(
        GrowingBackend(),
        StreamStore(max_streams=16),
        VOICE,
        StepExecutorConfig(reference_seconds=1.0, memory_budget=budget, reserve_tokens=reserve_tokens),
    )


def run_steps(engine: Token2WavStepExecutor, steps: list[list[Segment]]) -> tuple[list[list[SegmentResult]], int]:
    """Every step's results, and the most the live streams were counted at after any step."""
    outs, peak = [], 0
    for segments in steps:
        outs.append(engine.step(segments))
        peak = max(peak, engine.live_bytes())
    return outs, peak


def test_a_live_stream_whose_growth_does_not_fit_waits_and_resumes_with_its_solo_audio() -> None:
    engine = growing(budget=10)
    outs, peak = run_steps(
        engine,
        [
            [chunk(0, "a", 0, [1, 2, 3, 4]), chunk(1, "b", 0, [5, 6, 7, 8])],  # 4 + 4 of 10
            [chunk(0, "a", 1, [9, 10, 11]), chunk(1, "b", 1, [12])],  # a would hold 7: 7 + 4 > 10, it waits
            [chunk(0, "b", 2, [13], last=True), chunk(1, "a", 2, [14])],  # a still waits (b live at the start)
            [chunk(0, "a", 3, [15], last=True)],  # b ended: a's held chunks run in order
        ],
    )
    assert audio(outs[0][0]) == [1, 2, 3, 4] and audio(outs[1][1]) == [12] and audio(outs[2][0]) == [13]
    assert outs[1][0].audio is None and outs[1][0].error is None and outs[2][1].audio is None
    assert audio(outs[3][0]) == [9, 10, 11, 14, 15]
    assert peak <= 10 and engine.budget_waits == 1 and engine.budget_refusals == 0 and len(engine.store) == 0


def test_growth_doubles_the_reservation_where_it_fits_else_grows_to_what_it_needs() -> None:
    engine = growing(budget=20)
    engine.step([chunk(0, "a", 0, [1, 2, 3])])
    assert engine._reserved["a"] == 3
    engine.step([chunk(0, "a", 1, [4])])  # 4 tokens: doubled to 6 (fits)
    assert engine._reserved["a"] == 6
    engine.step([chunk(0, "b", 0, list(range(12)))])  # b: 12, a counted at 6: 18 of 20
    engine.step([chunk(0, "a", 2, [5, 6, 7])])  # a needs 7: doubling to 12 does not fit, 7 does
    assert engine._reserved["a"] == 7 and engine.live_bytes() == 19 and engine.budget_waits == 0


def test_a_reservation_makes_a_new_stream_wait_before_it_grows() -> None:
    engine = growing(budget=12, reserve_tokens=6)
    outs, peak = run_steps(
        engine,
        [
            [chunk(0, "a", 0, [1, 2])],  # reserves 2 + 6 = 8
            [chunk(0, "b", 0, [3, 4]), chunk(1, "a", 1, [5, 6, 7, 8, 9, 10])],  # b needs 8: waits; a grows to 8
            [chunk(0, "a", 2, [11], last=True), chunk(1, "b", 1, [12])],
            [chunk(0, "b", 2, [13])],
        ],
    )
    assert audio(outs[1][1]) == [5, 6, 7, 8, 9, 10] and outs[1][0].audio is None and engine.budget_waits == 1
    assert audio(outs[2][0]) == [11] and audio(outs[3][0]) == [3, 4, 12, 13]
    assert peak <= 12 and engine.backend.reserved[:2] == [8, 8]  # type: ignore[attr-defined]


def test_a_stream_that_grows_past_the_whole_budget_fails_alone_naming_its_length_and_the_budget() -> None:
    engine = growing(budget=10)
    engine.step([chunk(0, "a", 0, [1, 2, 3, 4, 5, 6]), chunk(1, "b", 0, [7, 8])])
    out = engine.step([chunk(0, "a", 1, [9, 10, 11, 12, 13]), chunk(1, "b", 1, [14])])
    assert out[0].error is not None and "request a: its stream grew to 11 tokens" in out[0].error
    assert "token2wav_memory_budget=10 bytes: it can never finish" in out[0].error
    assert audio(out[1]) == [14] and engine.store.get("a") is None and engine.budget_refusals == 1
    assert engine.live_bytes() == 4  # a's memory went back; b reserved 4 (its 2 tokens doubled when it grew to 3)


def test_a_growing_stream_whose_last_chunk_comes_while_it_waits_fails_and_frees_its_memory() -> None:
    engine = growing(budget=10)
    engine.step([chunk(0, "a", 0, [1, 2, 3, 4]), chunk(1, "b", 0, [5, 6, 7, 8])])
    engine.step([chunk(0, "a", 1, [9, 10, 11])])  # waits to grow
    out = engine.step([chunk(0, "a", 2, [12], last=True), chunk(1, "b", 1, [13])])
    assert out[0].error is not None and "its stream grew to 8 tokens" in out[0].error
    assert "its last chunk arrived while the other live streams hold 4 bytes" in out[0].error
    assert audio(out[1]) == [13] and engine.store.get("a") is None and engine.memory_snapshot().waiting_streams == 0


def test_the_stream_reserve_option_reads_seconds() -> None:
    class Config:
        additional_config = {"token2wav_stream_reserve_s": 60}

    assert stage_options(Config(), {}).reserve_seconds == 60.0
    Config.additional_config = {"token2wav_stream_reserve_s": -1}
    with pytest.raises(ValueError, match="token2wav_stream_reserve_s must be a number of audio seconds >= 0"):
        stage_options(Config(), {})


def test_the_later_chunks_of_a_stream_dropped_by_the_budget_are_rejected_naming_why() -> None:
    engine = growing(budget=10)
    engine.step([chunk(0, "a", 0, [1, 2, 3, 4, 5, 6])])
    out = engine.step([chunk(0, "a", 1, [7, 8, 9, 10, 11])])
    assert out[0].error is not None and "can never finish" in out[0].error
    out = engine.step([chunk(0, "a", 2, [12])])  # no new stream opens mid-reply
    assert out[0].error is not None and "was dropped by token2wav_memory_budget" in out[0].error, out[0].error
    assert len(engine.store) == 0


# ---- the stream count (`token2wav_max_streams`): an admission limit, never an eviction ------------------


def counted(limit: int, budget: int | None = None) -> Token2WavStepExecutor:
    return Token2WavStepExecutor(
        FakeBackend(),
        StreamStore(max_streams=None),
        VOICE,
        StepExecutorConfig(reference_seconds=1.0, memory_budget=budget, max_streams=limit),
    )


def test_a_stream_over_max_streams_waits_and_no_live_stream_is_evicted_for_it() -> None:
    engine = counted(limit=2)
    out = engine.step([chunk(0, "a", 0, [1, 2]), chunk(1, "b", 0, [3]), chunk(2, "c", 0, [4, 5])])
    assert audio(out[0]) == [1, 2] and audio(out[1]) == [3] and audio(out[2]) == []  # c waits, no error
    assert engine.store.get("a") is not None and engine.store.get("b") is not None and engine.store.get("c") is None
    out = engine.step([chunk(0, "c", 1, [6]), chunk(1, "a", 1, [7])])
    assert audio(out[0]) == [] and audio(out[1]) == [7]  # still two live streams
    out = engine.step([chunk(0, "b", 1, [8], last=True)])
    assert audio(out[0]) == [8] and len(engine.store) == 1
    out = engine.step([chunk(0, "c", 2, [9])])  # b ended: c's held chunks run in order, then this one
    assert audio(out[0]) == [4, 5, 6, 9] and engine.budget_waits == 1
    snap = engine.memory_snapshot()
    assert (snap.waiting_streams, snap.budget_bytes) == (0, None) and len(engine.store) == 2


def test_a_waiting_streams_last_chunk_over_the_count_runs_anyway_with_its_whole_audio() -> None:
    engine = counted(limit=1)
    engine.step([chunk(0, "a", 0, [1])])
    assert audio(engine.step([chunk(0, "b", 0, [2, 3])])[0]) == []
    out = engine.step([chunk(0, "b", 1, [4], last=True), chunk(1, "a", 1, [5])])
    assert audio(out[0]) == [2, 3, 4] and audio(out[1]) == [5]  # b ended within the step: nothing lost
    assert engine.store.get("b") is None and engine.budget_refusals == 0


def test_the_count_and_the_budget_both_hold_a_new_stream() -> None:
    engine = counted(limit=3, budget=6)
    engine.bytes_model.per_token = 1.0
    engine.step([chunk(0, "a", 0, [1, 2, 3, 4, 5])])
    out = engine.step([chunk(0, "b", 0, [6, 7])])  # one slot of three used, but 5 + 2 bytes > 6
    assert audio(out[0]) == [] and engine.memory_snapshot().waiting_streams == 1


def test_the_stage_sets_no_count_bound_by_default() -> None:
    class Config:
        additional_config: dict[str, object] = {}

    assert stage_options(Config(), {}).stream_limit is None
    Config.additional_config = {"token2wav_max_streams": 4}
    assert stage_options(Config(), {}).stream_limit == 4
