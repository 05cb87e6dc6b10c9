# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3Code2Wav driven as vLLM-Omni's runner drives it, with its talker's chunks emulated.

The talker (`standin/chunk_producer.py`, CosyVoice3 mode) sends the whole prefix each time with
`left_context_size`, hops 25 + pad / 50 / 100, `stream_finished` on the last chunk and its prompt
conditioning (`embed.*`) with the first. Requirements pinned here:
- cross-request batching: a randomised schedule (voices from the talker's conditioning, from
  reference audio + tokens, and the default voice; requests joining and leaving at different steps)
  gives every request the audio of the same stage serving it alone up to float32 rounding
  (`_audio_bound`), and the stage serving a request alone gives exactly the facade's stream of it
  (validated against the references in tests/model_executor/models/cosyvoice3/test_cosyvoice3_token2wav.py);
- the sync path (no stream meta) is a whole utterance; token-less terminal chunks end streams;
- bad input fails its own segment with a message naming the problem, the others are unaffected.

Batched vs alone is float32 rounding, not bit-identity. The flow launch differs from a row alone only
in the length of the sequence its grouped Conv1d kernels see, which can move each mel value by a few
ulps (flow/test_batched.py; bit-identical on the CPU this was first measured on, up to 2.9 eps x
max|mel| with oneDNN's AVX2 kernels), and a stacked vocoder push rounds its convolutions differently
again. The causal HiFT amplifies that: its sine source's phase is 2 pi x 480 x the running sum of
f0 h / 24000 over the frames, so a relative change d of f0 moves the sine argument of harmonic h by
d x its accumulated phase Phi (up to ~2e4 rad after 7 s), and the float32 rounding of that sum
(`PhaseMode.CUMULATIVE_FP32`) steps by an ulp of it. The audio moves by about its peak times the
phase error. `_audio_bound` is therefore

    eps32 x max|audio alone| x (AMPLITUDE_ULPS + PHASE_ULPS x Phi)

with Phi the phase the request's fastest harmonic accumulates (measured while the request runs alone,
`SinePhase`). Measured on an AVX2 EPYC (torch 2.13, oneDNN 3.12), 18 requests of 3 schedules and 12
of 4 stacked-vocoder groups: |batched - alone| <= 3.9 eps x peak x Phi (at most 1.3e-4 at a 0.023
peak, Phi 1.7e4 rad); with f0 quantised to 1/16 Hz (phase path removed) <= 112 eps x peak; 0 with the
convolutions run length-independently (float64, rounded once), and with oneDNN capped at SSE4.1 0
(schedules) and <= 63 eps x peak (stacked vocoder). A batched row whose mel is off by a relative
1e-6, or whose flow / vocoder state is another row's, fails it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import FinalChunk
from vllm_omni_token2wav.model_executor.layers.hift.source import harmonic_increments
from vllm_omni_token2wav.model_executor.layers.hift_causal.source import CausalSource
from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_code2wav import CosyVoice3Code2Wav
from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_token2wav import upstream_chunks
from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import (
    ChunkPayload,
    ProducerStream,
    all_chunks,
    forward_inputs,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.contract import SegmentKind, parse_step
from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import segment_errors
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import COSYVOICE3
from vllm_omni_token2wav.model_executor.models.token2wav_stage.options import stage_options

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]

OPTIONS: dict[str, Any] = {"device": "cpu", "n_timesteps": 2}
#: batched vs alone (`_audio_bound`, module docstring), in float32 eps of the solo audio's peak:
#: the decoder's own rounding (measured <= 112 eps with the phase path removed; 512 leaves 4x) ...
AMPLITUDE_ULPS = 512
#: ... plus a relative phase error of this many eps per radian the sine phase accumulated (measured <= 3.9)
PHASE_ULPS = 16


@dataclass
class Request:
    rid: str
    tokens: list[int]
    chunks: list[ChunkPayload]
    join: int
    prompt: Any = None
    sent: int = 0
    audio: list[torch.Tensor] = field(default_factory=list)


@dataclass
class SinePhase:
    """The sine phase the causal HiFT accumulates while `counting`: radians of its fastest harmonic,
    summed over the frames of every push (the largest row of a push)."""

    radians: float = 0.0
    counting: bool = False


@pytest.fixture
def sine_phase(monkeypatch: pytest.MonkeyPatch) -> SinePhase:
    """Meter the phase of `CausalSource.frame_sines` (`2 pi x 480 x sum (f0 h / 24000 mod 1)`) without changing it."""
    meter = SinePhase()
    original = CausalSource.frame_sines

    def frame_sines(self: CausalSource, f0: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if meter.counting:
            cfg = self.config
            cycles = harmonic_increments(f0.double()[..., None], cfg.nb_harmonics, cfg.sampling_rate).sum(dim=1)
            meter.radians += 2 * math.pi * cfg.upsample_scale * float(cycles.max())
        return original(self, f0, *args, **kwargs)

    monkeypatch.setattr(CausalSource, "frame_sines", frame_sines)
    return meter


@pytest.fixture(scope="module")
def stages(cv3_dir: Path) -> tuple[CosyVoice3Code2Wav, CosyVoice3Code2Wav]:
    """A stage for batched runs and another for solo runs (same weights, no shared state)."""
    out = (CosyVoice3Code2Wav(model=str(cv3_dir), **OPTIONS), CosyVoice3Code2Wav(model=str(cv3_dir), **OPTIONS))
    for stage in out:
        stage.load_weights([])
    return out


def _clip(seconds: float, start: float = 0.0) -> tuple[np.ndarray, int]:
    from vllm_omni_token2wav.assets.audio import speech_sample

    wav, rate = speech_sample()
    return wav[int(start * rate) : int((start + seconds) * rate)].copy(), rate


def _clip_tokens(seconds: float, seed: int) -> torch.Tensor:
    return torch.randint(0, 6561, (1, int(seconds * 25)), generator=torch.Generator().manual_seed(seed))


def _talker_request(stage: CosyVoice3Code2Wav, rid: str, tokens: list[int], voice: int, join: int = 0) -> Request:
    """voice 0: the default; 1..2: the talker's conditioning; 3: reference audio + its tokens."""
    if voice == 0:
        stream = ProducerStream(rid, tokens, COSYVOICE3, prompt_tokens=stage.default_voice.tokens.shape[1])
        return Request(rid, tokens, all_chunks(stream), join)
    seconds = 1.0 + 0.4 * voice
    clip, ids = _clip(seconds, start=0.3 * voice), _clip_tokens(seconds, seed=voice)
    prompt = stage.token2wav.prompt(clip, ids)
    if voice == 3:
        stream = ProducerStream(
            rid, tokens, COSYVOICE3, voice=clip, embed={"speech_token": ids}, prompt_tokens=prompt.num_tokens
        )
    else:
        embed = {"speech_token": [prompt.tokens], "speech_feat": [prompt.mel], "embedding": [prompt.embedding]}
        stream = ProducerStream(
            rid,
            tokens,
            COSYVOICE3,
            embed=embed | {"speech_token_len": [torch.tensor([prompt.num_tokens])]},
            prompt_tokens=prompt.num_tokens,
        )
    return Request(rid, tokens, all_chunks(stream), join, prompt)


def _forward(stage: CosyVoice3Code2Wav, payloads: list[ChunkPayload], flatten: bool = False) -> tuple[list, list]:  # type: ignore[type-arg]
    input_ids, kwargs = forward_inputs(payloads, stage.family, flatten=flatten)
    out = stage(input_ids, None, **kwargs).multimodal_outputs
    return out[COSYVOICE3.output_key], segment_errors(out)


def _solo(stage: CosyVoice3Code2Wav, request: Request) -> torch.Tensor:
    pieces = []
    for chunk in request.chunks:
        audio, errors = _forward(stage, [chunk])
        assert errors == [None], errors
        pieces.append(audio[0])
    return torch.cat(pieces)


def _alone(stage: CosyVoice3Code2Wav, request: Request, sine_phase: SinePhase) -> tuple[torch.Tensor, float]:
    """The request served alone by `stage`, and the sine phase (radians) its vocoder accumulated."""
    sine_phase.radians, sine_phase.counting = 0.0, True
    try:
        return _solo(stage, request), sine_phase.radians
    finally:
        sine_phase.counting = False


def _audio_bound(alone: torch.Tensor, radians: float) -> float:
    """How far batched audio may be from the request alone: float32 rounding through the vocoder (module docstring)."""
    eps = torch.finfo(torch.float32).eps
    return eps * float(alone.abs().max()) * (AMPLITUDE_ULPS + PHASE_ULPS * radians)


def test_randomised_schedule_equals_each_request_alone_and_the_facade(
    stages: tuple[CosyVoice3Code2Wav, CosyVoice3Code2Wav], sine_phase: SinePhase
) -> None:
    batched, solo = stages
    rng = random.Random(7)
    requests = [
        _talker_request(
            batched, f"r{i}", [rng.randrange(6561) for _ in range(rng.randrange(20, 190))], i % 4, rng.randrange(3)
        )
        for i in range(6)
    ]
    assert any(len(r.chunks) >= 3 for r in requests)
    step, widest = 0, 0
    while any(r.sent < len(r.chunks) for r in requests):
        ready = [r for r in requests if r.join <= step and r.sent < len(r.chunks) and rng.random() < 0.7]
        if ready:
            audio, errors = _forward(batched, [r.chunks[r.sent] for r in ready], flatten=step % 2 == 1)
            assert errors == [None] * len(ready), errors
            widest = max([widest, *(len(launch.rows) for launch in batched.executor.last_plan.flow)])
            for r, a in zip(ready, audio, strict=True):
                r.audio.append(a)
                r.sent += 1
        step += 1
    assert widest >= 3 and batched.live_streams == 0
    alone_audio = {}
    for r in requests:
        got, (alone, radians) = torch.cat(r.audio), _alone(solo, r, sine_phase)
        assert got.shape == alone.shape == (960 * len(r.tokens),), r.rid
        diff, bound = float((got - alone).abs().max()), _audio_bound(alone, radians)
        assert diff <= bound, f"{r.rid}: {diff:.2e} from the request alone, bound {bound:.2e} (phase {radians:.0f} rad)"
        alone_audio[r.rid] = alone
    # the stage's stream of a request is the facade's stream with the request's seed (both one row per launch)
    r = next(r for r in requests if r.prompt is not None and len(r.chunks) >= 3)
    core = batched.token2wav
    state = core.set_stream_cache(prompt=r.prompt, seed=batched.executor.noise_seed(r.rid, 0))
    ids = torch.tensor(r.tokens)
    facade = [
        core.stream(ids[part], last_chunk=last, return_waveform=True, state=state)
        for part, last in upstream_chunks(len(r.tokens), r.prompt.num_tokens)
    ]
    assert torch.equal(torch.cat(facade, dim=1)[0], alone_audio[r.rid])


def test_sync_mode_is_a_whole_utterance_and_a_terminal_chunk_ends_a_stream(
    stages: tuple[CosyVoice3Code2Wav, CosyVoice3Code2Wav],
) -> None:
    stage = stages[0]
    tokens = list(range(100, 150))
    request = _talker_request(stage, "sync", tokens, 1)
    embed = dict(request.chunks[0].embed or {})
    info = {"embed": embed, "meta": {"finished": torch.tensor(True)}}  # text2flow's payload: no stream meta
    out = stage(
        torch.tensor(tokens), None, runtime_additional_information=[info], seq_token_counts=[50], request_ids=["sync"]
    )
    audio = out.multimodal_outputs[COSYVOICE3.output_key][0]
    expected = stage.token2wav(tokens, prompt=request.prompt, seed=stage.executor.noise_seed("sync", 0))
    assert segment_errors(out.multimodal_outputs) == [None] and torch.equal(audio, expected[0])
    # a request that generated nothing: the talker's empty `finished` chunk, no error, no audio
    empty = ProducerStream("none", [], COSYVOICE3, embed=embed, prompt_tokens=request.prompt.num_tokens)
    (terminal,) = all_chunks(empty)
    assert terminal.tokens == () and terminal.offset is None
    audio_out, errors = _forward(stage, [terminal])
    assert errors == [None] and audio_out[0].numel() == 0

    # windows with chunk_seq (another producer's convention) and a token-less last chunk: the flush computes
    # the pending lookahead tokens' mel and releases everything the vocoder held back
    def window(tokens: list[int], seq: int, last: bool) -> dict[str, Any]:
        return {
            "codes": {"audio": torch.tensor(tokens, dtype=torch.long)},
            "meta": {"chunk_seq": seq, "stream_finished": last},
        }

    pieces = []
    for seq, (tokens_k, last) in enumerate(((list(range(28)), False), (list(range(25, 40)), False), ([], True))):
        ids = torch.tensor(tokens_k or [0])
        out = stage(
            ids,
            None,
            runtime_additional_information=[window(tokens_k, seq, last)],
            seq_token_counts=[ids.numel()],
            request_ids=["win"],
        )
        assert segment_errors(out.multimodal_outputs) == [None]
        pieces.append(out.multimodal_outputs[COSYVOICE3.output_key][0])
    assert [p.numel() for p in pieces] == [(50 - 8) * 480, 24 * 480, (6 + 8) * 480]
    assert stage.live_streams == 0


def test_bad_input_fails_its_own_segment_only(stages: tuple[CosyVoice3Code2Wav, CosyVoice3Code2Wav]) -> None:
    stage = stages[0]
    good = _talker_request(stage, "good", list(range(200, 260)), 0)
    twin_audio = _solo(stages[1], good)  # the same request on a stage that never sees the bad segments
    bad_id = _talker_request(stage, "bad-id", [1, 2, 6561, 4] * 10, 0)
    long_embed = {
        "speech_token": torch.zeros(1, 800, dtype=torch.long),
        "speech_feat": torch.zeros(1, 1600, 80),
        "embedding": torch.zeros(1, 192),
    }
    too_long = ChunkPayload("too-long", tuple(range(28)), False, offset=0, embed=long_embed)
    no_tokens = ChunkPayload("no-tokens", tuple(range(28)), False, offset=0, voice=_clip(1.0))
    bad_offset = ChunkPayload("bad-offset", tuple(range(28)), False, offset=30)
    audio, errors = _forward(stage, [good.chunks[0], bad_id.chunks[0], too_long, no_tokens, bad_offset])
    assert errors[0] is None
    assert errors[1] is not None and "codes.audio: speech token id 6561 is outside [0, 6561)" in errors[1]
    assert errors[2] is not None and "800 tokens (32.0 s) but a prompt holds at most 750" in errors[2]
    assert errors[3] is not None and "needs the reference audio's speech tokens too" in errors[3]
    assert errors[4] is not None and "left_context_size is 30 but the chunk's prefix has 28 tokens" in errors[4]
    assert all(a.numel() == 0 for a in audio[1:])
    # a chunk that does not re-send the lookahead it must continue from
    skip = replace(good.chunks[1], tokens=good.chunks[1].tokens[:-10], offset=(good.chunks[1].offset or 0) + 1)
    _, errors = _forward(stage, [skip])
    assert errors[0] is not None and "must start with the 3 lookahead token(s)" in errors[0]
    rest = [audio[0]]
    for chunk in good.chunks[1:]:
        out, errors = _forward(stage, [chunk])
        assert errors == [None]
        rest.append(out[0])
    assert torch.equal(torch.cat(rest), twin_audio)


def test_a_click_as_reference_audio_fails_its_own_segment(
    stages: tuple[CosyVoice3Code2Wav, CosyVoice3Code2Wav],
) -> None:
    stage = stages[0]
    click = np.zeros(16000, np.float32)
    click[8000] = 0.5
    good = _talker_request(stage, "click-neighbour", list(range(300, 360)), 0)
    bad = ChunkPayload(
        "click-ref", tuple(range(28)), False, offset=0, voice=(click, 16000), embed={"speech_token": _clip_tokens(1, 9)}
    )
    audio, errors = _forward(stage, [bad, good.chunks[0]])
    assert errors[1] is None and audio[1].numel() > 0
    assert errors[0] is not None and errors[0].startswith(
        "request click-ref: ValueError: reference audio (16000 samples"
    )
    assert "<array>: prompt has 0.03 s of sustained signal in its 1.00 s, below the 0.3 s minimum" in errors[0]
    assert audio[0].numel() == 0


def test_the_vocoder_may_batch_rows_at_equal_positions(cv3_dir: Path, sine_phase: SinePhase) -> None:
    stage = CosyVoice3Code2Wav(model=str(cv3_dir), batch_vocoder=True, **OPTIONS)
    solo = CosyVoice3Code2Wav(model=str(cv3_dir), **OPTIONS)
    requests = [_talker_request(stage, f"v{i}", [(37 * i + k) % 6561 for k in range(80)], 0) for i in range(3)]
    for k in range(len(requests[0].chunks)):
        audio, errors = _forward(stage, [r.chunks[k] for r in requests])
        assert errors == [None] * 3
        assert [len(v.rows) for v in stage.executor.last_plan.vocoder] == [3]
        for r, a in zip(requests, audio, strict=True):
            r.audio.append(a)
    for r in requests:
        alone, radians = _alone(solo, r, sine_phase)
        diff, bound = float((torch.cat(r.audio) - alone).abs().max()), _audio_bound(alone, radians)
        assert diff <= bound, f"{r.rid}: {diff:.2e} from the request alone, bound {bound:.2e} (phase {radians:.0f} rad)"


def test_the_last_chunk_is_upstreams_full_attention_by_default_and_block_causal_on_request(
    stages: tuple[CosyVoice3Code2Wav, CosyVoice3Code2Wav], cv3_dir: Path
) -> None:
    """`token2wav_final_chunk` defaults to "full_attention" (what upstream serves); "block_causal" from the deploy
    YAML's extra or as an option reaches the facade, and changes only the last chunk's audio."""
    assert stage_options(None, {}).final_chunk == FinalChunk.FULL_ATTENTION.value
    yaml_extra = SimpleNamespace(additional_config={"token2wav_final_chunk": "block_causal"})
    assert stage_options(yaml_extra, {}).final_chunk == FinalChunk.BLOCK_CAUSAL.value
    default = stages[1]
    block = CosyVoice3Code2Wav(model=str(cv3_dir), final_chunk="block_causal", **OPTIONS)
    block.load_weights([])
    assert default.token2wav.final_chunk is FinalChunk.FULL_ATTENTION
    assert block.token2wav.final_chunk is FinalChunk.BLOCK_CAUSAL
    tokens = [(53 * k + 11) % 6561 for k in range(120)]
    served = {}
    for stage in (default, block):
        request = _talker_request(stage, "final", tokens, 1)  # same id, same noise seed on both stages
        assert len(request.chunks) >= 3
        pieces = []
        for chunk in request.chunks:
            audio, errors = _forward(stage, [chunk])
            assert errors == [None], errors
            pieces.append(audio[0])
        # the stage's stream is the facade's stream in the stage's mode (validated against the references in
        # tests/model_executor/models/cosyvoice3/test_cosyvoice3_token2wav.py)
        core = stage.token2wav
        state = core.set_stream_cache(prompt=request.prompt, seed=stage.executor.noise_seed(request.rid, 0))
        ids = torch.tensor(tokens)
        facade = [
            core.stream(ids[part], last_chunk=last, return_waveform=True, state=state)[0]
            for part, last in upstream_chunks(len(tokens), request.prompt.num_tokens)
        ]
        assert torch.equal(torch.cat(facade), torch.cat(pieces))
        served[core.final_chunk] = torch.cat(pieces), pieces[-1].numel()
    (full, last_full), (blocked, last_block) = served[FinalChunk.FULL_ATTENTION], served[FinalChunk.BLOCK_CAUSAL]
    assert full.shape == blocked.shape and last_full == last_block
    assert torch.equal(full[:-last_full], blocked[:-last_block]), "chunks before the last are the same computation"
    assert not torch.allclose(full[-last_full:], blocked[-last_block:], atol=1e-5, rtol=0)


def test_the_contract_reads_cosyvoice3s_talker() -> None:
    payloads = [
        ChunkPayload("a", tuple(range(10, 50)), False, offset=12),
        ChunkPayload("b", (), True),
        ChunkPayload("c", (1, 2, 3), True, offset=0),
    ]
    for flatten in (False, True):
        input_ids, kwargs = forward_inputs(payloads, COSYVOICE3, flatten=flatten)
        step = parse_step(input_ids, kwargs.pop("runtime_additional_information"), kwargs, COSYVOICE3)
        a, b, c = step.segments
        assert a.kind is SegmentKind.CHUNK and a.tokens == tuple(range(22, 50)) and a.chunk is not None
        assert not a.chunk.last and a.chunk.chunk_seq is None
        assert b.kind is SegmentKind.CHUNK and b.tokens == () and b.chunk is not None and b.chunk.last
        assert c.tokens == (1, 2, 3) and c.chunk is not None and c.chunk.last


def _whole_step(stage: CosyVoice3Code2Wav, rows: list[tuple[str, list[int], dict[str, Any]]]) -> tuple[list, list]:  # type: ignore[type-arg]
    """One step of whole utterances (sync path: a payload without stream meta), `(request id, tokens, embed)` each."""
    infos = [{"embed": embed, "meta": {"finished": torch.tensor(True)}} for _, _, embed in rows]
    out = stage(
        torch.tensor([t for _, tokens, _ in rows for t in tokens]),
        None,
        runtime_additional_information=infos,
        seq_token_counts=[len(tokens) for _, tokens, _ in rows],
        request_ids=[rid for rid, _, _ in rows],
    )
    return out.multimodal_outputs[COSYVOICE3.output_key], segment_errors(out.multimodal_outputs)


def test_whole_utterances_of_a_step_share_launches_and_each_equals_its_run_alone(
    stages: tuple[CosyVoice3Code2Wav, CosyVoice3Code2Wav], monkeypatch: pytest.MonkeyPatch
) -> None:
    stage = stages[0]
    backend = stage.executor.backend
    calls: list[tuple[str, int]] = []
    whole, whole_rows = backend.whole, backend.whole_rows
    monkeypatch.setattr(backend, "whole", lambda *a: calls.append(("whole", 1)) or whole(*a))
    monkeypatch.setattr(backend, "whole_rows", lambda works: calls.append(("rows", len(works))) or whole_rows(works))
    rng = random.Random(7)
    rows = []
    for i, (voice, n) in enumerate(((1, 61), (0, 17), (2, 90), (1, 33))):  # different lengths and voices
        tokens = [rng.randrange(6561) for _ in range(n)]
        embed = dict(_talker_request(stage, f"w{i}", tokens, voice).chunks[0].embed or {}) if voice else {}
        rows.append((f"w{i}", tokens, embed))
    alone = []
    for row in rows:
        audio, errors = _whole_step(stage, [row])
        assert errors == [None] and audio[0].numel() == 2 * 480 * len(row[1])
        alone.append(audio[0])
    assert calls == [("rows", 1)] * 4
    launches = stage.executor.whole_launches

    calls.clear()
    audio, errors = _whole_step(stage, rows)
    assert errors == [None] * 4
    assert calls == [("rows", 4)] and stage.executor.whole_launches == launches + 1  # one launch instead of four
    assert [launch.rows for launch in stage.executor.last_plan.whole] == [(0, 1, 2, 3)]
    for i, (got, want) in enumerate(zip(audio, alone, strict=True)):
        assert got.shape == want.shape, i
        assert float((got - want).abs().max()) <= 1e-5, f"w{i}: max |batched - alone| {(got - want).abs().max():.3g}"

    # a bad id is refused at admission (`check_whole`): the other rows still share one launch, with the same audio
    calls.clear()
    bad = ("bad", [1, 2, 6561, 4] * 5, rows[0][2])
    audio, errors = _whole_step(stage, [rows[0], bad, rows[2], rows[3]])
    assert errors[0] is None and errors[2] is None and errors[3] is None
    assert errors[1] is not None and "6561" in errors[1] and audio[1].numel() == 0
    assert calls == [("rows", 3)]
    for got, want in zip((audio[0], audio[2], audio[3]), (alone[0], alone[2], alone[3]), strict=True):
        assert float((got - want).abs().max()) <= 1e-5

    # a launch that raises (a device fault) is re-run row by row: only the row that fails alone loses its audio
    def faulty(works: list[Any]) -> list[torch.Tensor]:
        calls.append(("rows", len(works)))
        if any(w.tokens == tuple(rows[1][1]) for w in works):
            raise RuntimeError("device fault")
        return whole_rows(works)

    monkeypatch.setattr(backend, "whole_rows", faulty)
    calls.clear()
    audio, errors = _whole_step(stage, rows)
    assert calls == [("rows", 4)] + [("rows", 1)] * 4
    assert errors[1] is not None and "device fault" in errors[1] and audio[1].numel() == 0
    for i in (0, 2, 3):
        assert errors[i] is None and float((audio[i] - alone[i]).abs().max()) <= 1e-5
