# SPDX-License-Identifier: Apache-2.0
"""Cross-request batching through the real stage: every request's audio equals the same request run alone.

Randomised, seeded schedules drive `MiniCPMO45Code2Wav` / `StepAudio2Token2WavForConditionalGeneration`
as vLLM-Omni's runner does (`forward_inputs`: one flat `input_ids`, per-segment producer dicts):
requests with different voices and lengths join at different steps, send their chunks when their
talker has them (so first, middle and last chunks share steps), leave at their last chunk, and some
send a bad chunk mid-stream. The reference for each request is the same stage code serving that
request alone, one chunk per `forward` (what the stage's own reference-driver tests pin against the
module-level flow and HiFT, tests/model_executor/models/token2wav_core/test_token2wav_synthesis.py).
Target: equal lengths and max abs <= 1e-5 in fp32 on CPU; a failing segment leaves the others of
its step bit-equal to the same step without it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.model_executor.models.token2wav_stage.conftest import FAST_OPTIONS
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
from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import segment_errors
from vllm_omni_token2wav.model_executor.models.token2wav_stage.stage_model import Token2WavStageModel

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]

TOLERANCE = 1e-5


@dataclass
class Request:
    rid: str
    chunks: list[ChunkPayload]
    join: int
    sent: int = 0
    audio: list[torch.Tensor] = field(default_factory=list)


def _schedule(
    family_stage: type[Token2WavStageModel], voices: Sequence[tuple[np.ndarray, int]], n: int, seed: int
) -> list[Request]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        tokens = [rng.randrange(6561) for _ in range(rng.randrange(12, 96))]
        voice = None if i % 4 == 0 else voices[i % len(voices)]  # the default voice and three others, shared
        stream = ProducerStream(f"req-{i}", tokens, family_stage.family, voice=voice)
        out.append(Request(f"req-{i}", all_chunks(stream), join=rng.randrange(3)))
    return out


def _forward(stage: Token2WavStageModel, payloads: Sequence[ChunkPayload]) -> tuple[list[torch.Tensor], list]:
    input_ids, kwargs = forward_inputs(payloads, stage.family)
    out = stage(input_ids, None, **kwargs).multimodal_outputs
    return out["model_outputs"], segment_errors(out)


def _run_batched(stage: Token2WavStageModel, requests: list[Request], seed: int) -> None:
    """Each step: every joined request with chunks left sends its next one with probability 0.7."""
    rng = random.Random(seed)
    step = 0
    while any(r.sent < len(r.chunks) for r in requests):
        ready = [r for r in requests if r.join <= step and r.sent < len(r.chunks) and rng.random() < 0.7]
        if ready:
            audio, errors = _forward(stage, [r.chunks[r.sent] for r in ready])
            assert errors == [None] * len(ready), errors
            for r, a in zip(ready, audio, strict=True):
                r.audio.append(a)
                r.sent += 1
        step += 1


def _solo(stage: Token2WavStageModel, request: Request) -> torch.Tensor:
    pieces = []
    for chunk in request.chunks:
        audio, errors = _forward(stage, [chunk])
        assert errors == [None], errors
        pieces.append(audio[0])
    return torch.cat(pieces)


def _assert_equal_to_solo(requests: list[Request], solo: Token2WavStageModel) -> None:
    for r in requests:
        got, alone = torch.cat(r.audio), _solo(solo, r)
        assert got.shape == alone.shape, (r.rid, got.shape, alone.shape)
        assert float((got - alone).abs().max()) <= TOLERANCE, r.rid


@pytest.fixture(scope="module")
def minicpmo(model_dir: Path) -> tuple[MiniCPMO45Code2Wav, MiniCPMO45Code2Wav]:
    """A stage for batched runs and another for solo runs (same weights, no shared state)."""
    return MiniCPMO45Code2Wav(model=str(model_dir), **FAST_OPTIONS), MiniCPMO45Code2Wav(
        model=str(model_dir), **FAST_OPTIONS
    )


def test_randomised_schedule_of_seven_requests_equals_each_request_alone(
    minicpmo: tuple[MiniCPMO45Code2Wav, MiniCPMO45Code2Wav], voices: list[tuple[np.ndarray, int]]
) -> None:
    batched, solo = minicpmo
    requests = _schedule(MiniCPMO45Code2Wav, voices, n=7, seed=1)
    lengths = {len(c.tokens) for r in requests for c in r.chunks}
    assert len(lengths) >= 3 and any(len(r.chunks) >= 3 for r in requests)  # mixed chunk lengths, real streams
    _run_batched(batched, requests, seed=2)
    assert batched.live_streams == 0  # every request left at its last chunk
    _assert_equal_to_solo(requests, solo)
    for r in requests:  # exact sample counts: 960 per emitted token (the first chunk's 3 silence codes included)
        emitted = sum(len(c.tokens) - (0 if c.last else 3) for c in r.chunks)
        assert sum(a.numel() for a in r.audio) == 960 * emitted


def test_a_bad_segment_fails_alone_and_the_rest_of_its_step_is_bit_equal(
    minicpmo: tuple[MiniCPMO45Code2Wav, MiniCPMO45Code2Wav], model_dir: Path, voices: list[tuple[np.ndarray, int]]
) -> None:
    batched, solo = minicpmo
    twin = MiniCPMO45Code2Wav(model=str(model_dir), **FAST_OPTIONS)  # the same steps without the bad segment
    requests = _schedule(MiniCPMO45Code2Wav, voices, n=6, seed=3)
    for r in requests:
        r.chunks = [replace(c, request_id=f"bad-{c.request_id}") for c in r.chunks]
    victim = max(requests, key=lambda r: len(r.chunks))
    others = [r for r in requests if r is not victim]
    assert len(victim.chunks) >= 3
    bad_chunks = [
        (replace(victim.chunks[2], chunk_seq=2), "skipped chunk: expected chunk_seq 1 (epoch 0), got 2"),
        (
            replace(victim.chunks[1], tokens=(*victim.chunks[1].tokens[:-1], 7000)),
            "speech token 7000 at position 27 is outside [0, 6561)",
        ),
    ]
    for step in range(3):
        good = [r for r in others if r.sent < len(r.chunks)]
        payloads = [r.chunks[r.sent] for r in good]
        if step == 0:
            payloads.insert(0, victim.chunks[0])
        else:
            payloads.insert(0, bad_chunks[step - 1][0])
        audio, errors = _forward(batched, payloads)
        if step == 0:  # the twin starts the victim's stream too, so both stages hold the same streams
            twin_audio, twin_errors = _forward(twin, payloads)
            twin_audio, twin_errors = twin_audio[1:], twin_errors[1:]
        else:  # ... and then never sees its bad chunks
            twin_audio, twin_errors = _forward(twin, payloads[1:])
        assert errors[1:] == twin_errors == [None] * len(good)
        assert all(torch.equal(a, b) for a, b in zip(audio[1:], twin_audio, strict=True))  # bit-equal
        if step == 0:
            victim.audio.append(audio[0])
            victim.sent = 1
        else:
            message = f"request {victim.chunks[0].request_id}: "
            assert errors[0] is not None and errors[0].startswith(message) and bad_chunks[step - 1][1] in errors[0]
            assert audio[0].numel() == 0
            assert batched.streams.get(victim.chunks[0].request_id).chunk_seq == 0  # type: ignore[union-attr]
        for r, a in zip(good, audio[1:], strict=True):
            r.audio.append(a)
            r.sent += 1
    # The victim resumes at its chunk 1 (its state untouched by the bad chunks); all equal their solo runs.
    _run_batched(batched, requests, seed=4)
    _assert_equal_to_solo(requests, solo)


def test_a_click_as_a_requests_voice_fails_that_request_only(
    minicpmo: tuple[MiniCPMO45Code2Wav, MiniCPMO45Code2Wav], voices: list[tuple[np.ndarray, int]]
) -> None:
    """A click in a second of silence sent as reference audio (`codes.ref`) is refused with the measured
    active duration; the other request of the step is served."""
    batched, _ = minicpmo
    click = np.zeros(16000, np.float32)
    click[8000] = 0.5
    family = MiniCPMO45Code2Wav.family
    bad = all_chunks(ProducerStream("click-voice", list(range(200, 240)), family, voice=(click, 16000)))
    good = all_chunks(ProducerStream("click-neighbour", list(range(100, 140)), family, voice=voices[1]))
    audio, errors = _forward(batched, [bad[0], good[0]])
    assert errors[1] is None and audio[1].numel() > 0
    assert errors[0] is not None and errors[0].startswith(
        "request click-voice: ValueError: reference audio (16000 samples at 16000 Hz): <array>: prompt has 0.0"
    )
    assert "s of sustained signal in its 1.50 s, below the 0.3 s minimum for a reference voice" in errors[0]
    assert audio[0].numel() == 0 and batched.streams.get("click-voice") is None


def assert_a_failing_launch_costs_only_its_culprit(
    prefix: str,
    batched: Token2WavStageModel,
    solo: Token2WavStageModel,
    requests: list[Request],
    monkeypatch: pytest.MonkeyPatch,
    *,
    method: str,
    error: str,
    seed: int,
) -> None:
    """Make the backend's `method` raise `error` for launches holding request 1's first chunk: only
    request 1 fails (its stream never committed, nothing else lost); then every request, the culprit
    started over, equals its solo run. `prefix` renames the requests (stages are shared by tests)."""
    for r in requests:
        r.chunks = [replace(c, request_id=f"{prefix}{c.request_id}") for c in r.chunks]
    culprit = requests[1]
    poison = culprit.chunks[0].tokens[-1]
    backend = type(batched.backend)
    real = getattr(backend, method)

    def failing(self, works, *args):  # type: ignore[no-untyped-def]
        if any(w.tokens[-1] == poison for w in works):
            raise RuntimeError(error)
        return real(self, works, *args)

    monkeypatch.setattr(backend, method, failing)
    audio, errors = _forward(batched, [r.chunks[0] for r in requests])
    monkeypatch.undo()
    assert errors[1] is not None and error in errors[1] and audio[1].numel() == 0
    assert [e for i, e in enumerate(errors) if i != 1] == [None] * (len(requests) - 1)
    assert batched.streams.get(culprit.chunks[0].request_id) is None  # its first chunk never committed
    for i, r in enumerate(requests):
        if i != 1:
            r.audio.append(audio[i])
            r.sent = 1
    _run_batched(batched, requests, seed=seed)
    _assert_equal_to_solo(requests, solo)


def test_a_kernel_failure_inside_a_batched_launch_costs_only_the_culprit(
    minicpmo: tuple[MiniCPMO45Code2Wav, MiniCPMO45Code2Wav],
    voices: list[tuple[np.ndarray, int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batched, solo = minicpmo
    requests = _schedule(MiniCPMO45Code2Wav, voices, n=4, seed=5)
    assert_a_failing_launch_costs_only_its_culprit(
        "k-",
        batched,
        solo,
        requests,
        monkeypatch,
        method="run_flow",
        error="CUDA error: an illegal memory access was encountered",
        seed=6,
    )


def test_step_audio2_batches_streams_of_many_requests_and_whole_utterances_share_the_step(
    model_dir: Path, voices: list[tuple[np.ndarray, int]]
) -> None:
    """Upstream refuses a second streaming request per step; here they batch, chunks in arrival order
    (Step-Audio2's producer sends no chunk_seq), and a whole utterance rides along."""
    batched = StepAudio2Token2WavForConditionalGeneration(model=str(model_dir), **FAST_OPTIONS)
    solo = StepAudio2Token2WavForConditionalGeneration(model=str(model_dir), **FAST_OPTIONS)
    requests = _schedule(StepAudio2Token2WavForConditionalGeneration, voices, n=4, seed=7)
    whole_tokens = [5, 900, 17, 6000, 33, 2]
    input_ids, kwargs = forward_inputs([requests[0].chunks[0], requests[1].chunks[0]], batched.family)
    input_ids = torch.cat([input_ids, torch.tensor(whole_tokens)])
    kwargs["seq_token_counts"].append(len(whole_tokens))
    kwargs["request_ids"].append("whole-1")
    kwargs["runtime_additional_information"].append({"codes": {"audio": torch.tensor(whole_tokens)}})
    out = batched(input_ids, None, **kwargs).multimodal_outputs
    assert segment_errors(out) == [None, None, None]
    whole = out["model_outputs"][2]
    alone_ids, alone_kwargs = (
        torch.tensor(whole_tokens),
        {
            "seq_token_counts": [6],
            "request_ids": ["whole-1"],
            "runtime_additional_information": [{"codes": {"audio": torch.tensor(whole_tokens)}}],
        },
    )
    assert torch.equal(whole, solo(alone_ids, None, **alone_kwargs).multimodal_outputs["model_outputs"][0])
    assert whole.shape == (960 * len(whole_tokens),) and batched.live_streams == sum(
        not r.chunks[0].last for r in requests[:2]
    )
    for r, a in zip(requests[:2], out["model_outputs"][:2], strict=True):
        r.audio.append(a)
        r.sent = 1
    _run_batched(batched, requests, seed=8)
    _assert_equal_to_solo(requests, solo)


def test_bucket_padded_launches_give_the_unpadded_audio(
    minicpmo: tuple[MiniCPMO45Code2Wav, MiniCPMO45Code2Wav],
    model_dir: Path,
    voices: list[tuple[np.ndarray, int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Graph-capture shapes: frames padded to a stage-frame bucket, vocoder rows to a batch bucket."""
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_STAGE_FRAME_BUCKETS", "64:2048")
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_BATCH_BUCKETS", "4,8")
    _, solo = minicpmo
    padded = MiniCPMO45Code2Wav(model=str(model_dir), pad_to_buckets=True, **FAST_OPTIONS)
    requests = _schedule(MiniCPMO45Code2Wav, voices, n=3, seed=9)
    for r in requests:
        r.chunks = [replace(c, request_id=f"pad-{c.request_id}") for c in r.chunks]
    _run_batched(padded, requests, seed=10)
    plan = padded.executor.last_plan
    assert all(launch.pad > 0 for launch in plan.vocoder)  # 1-3 rows -> 4
    assert all((launch.frames + launch.pad) % 64 == 0 for launch in plan.flow)
    _assert_equal_to_solo(requests, solo)


def test_step_audio2_whole_utterances_of_a_step_share_one_launch_and_each_equals_its_run_alone(
    model_dir: Path, voices: list[tuple[np.ndarray, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sync path (`async_chunk: false`): 4 whole utterances of different lengths and voices in one step run
    in one launch (`backend.whole_rows`), each with the audio it gets alone; a bad row fails alone."""
    batched = StepAudio2Token2WavForConditionalGeneration(model=str(model_dir), **FAST_OPTIONS)
    solo = StepAudio2Token2WavForConditionalGeneration(model=str(model_dir), **FAST_OPTIONS)
    rng = random.Random(11)

    def info(tokens: list[int], voice: int | None) -> dict[str, object]:
        out: dict[str, object] = {"codes": {"audio": torch.tensor(tokens)}}
        if voice is not None:
            out |= {"ref_audio": voices[voice][0], "ref_audio_sr": voices[voice][1]}
        return out

    rows = [
        (f"w{i}", [rng.randrange(6561) for _ in range(n)], v)
        for i, (n, v) in enumerate(((31, None), (8, 0), (47, 1), (19, 0)))
    ]

    def step(stage: Token2WavStageModel, rows: list[tuple[str, list[int], int | None]]) -> tuple[list, list]:  # type: ignore[type-arg]
        out = stage(
            torch.tensor([t for _, tokens, _ in rows for t in tokens]),
            None,
            seq_token_counts=[len(tokens) for _, tokens, _ in rows],
            request_ids=[rid for rid, _, _ in rows],
            runtime_additional_information=[info(tokens, v) for _, tokens, v in rows],
        ).multimodal_outputs
        return out["model_outputs"], segment_errors(out)

    alone = []
    for row in rows:
        audio, errors = step(solo, [row])
        assert errors == [None] and audio[0].shape == (960 * len(row[1]),)
        alone.append(audio[0])
    backend = batched.executor.backend
    batched.load_weights([])
    calls: list[int] = []
    whole_rows = backend.whole_rows
    monkeypatch.setattr(backend, "whole_rows", lambda works: calls.append(len(works)) or whole_rows(works))
    audio, errors = step(batched, rows)
    assert errors == [None] * 4 and calls == [4]  # one launch instead of four
    for i, (got, want) in enumerate(zip(audio, alone, strict=True)):
        assert got.shape == want.shape and float((got - want).abs().max()) <= TOLERANCE, i

    calls.clear()
    bad = ("bad", [3, 7, 10**5, 9] * 4, None)
    audio, errors = step(batched, [rows[0], bad, rows[2]])
    assert errors[0] is None and errors[2] is None and errors[1] is not None and audio[1].numel() == 0
    assert "100000" in errors[1] and calls == [2]  # refused at admission (`check_whole`): the others share a launch
    for got, want in ((audio[0], alone[0]), (audio[2], alone[2])):
        assert float((got - want).abs().max()) <= TOLERANCE
