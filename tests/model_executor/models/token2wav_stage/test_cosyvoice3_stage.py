# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3Code2Wav driven as vLLM-Omni's runner drives it, with its talker's chunks emulated.

The talker (`token2wav_producer`, CosyVoice3 mode) sends the whole prefix each time with
`left_context_size`, hops 25 + pad / 50 / 100, `stream_finished` on the last chunk and its prompt
conditioning (`embed.*`) with the first. Requirements pinned here:
- cross-request batching: a randomised schedule (voices from the talker's conditioning, from
  reference audio + tokens, and the default voice; requests joining and leaving at different steps)
  gives every request exactly the audio of the same stage serving it alone (<= 1e-5; the flow launch
  is bit-identical and the vocoder runs one request per launch), and the stage's audio equals the
  facade's stream of the same request (validated against the references in
  tests/model_executor/models/cosyvoice3/test_cosyvoice3_token2wav.py);
- the sync path (no stream meta) is a whole utterance; token-less terminal chunks end streams;
- bad input fails its own segment with a message naming the problem, the others are unaffected.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from vllm_omni_token2wav.benchmarks.token2wav_producer import ChunkPayload, ProducerStream, all_chunks, forward_inputs
from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_code2wav import CosyVoice3Code2Wav
from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_token2wav import upstream_chunks
from vllm_omni_token2wav.model_executor.models.token2wav_stage.contract import SegmentKind, parse_step
from vllm_omni_token2wav.model_executor.models.token2wav_stage.errors import segment_errors
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import COSYVOICE3

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]

OPTIONS: dict[str, Any] = {"device": "cpu", "n_timesteps": 2}
TOLERANCE = 1e-5


@dataclass
class Request:
    rid: str
    tokens: list[int]
    chunks: list[ChunkPayload]
    join: int
    prompt: Any = None
    sent: int = 0
    audio: list[torch.Tensor] = field(default_factory=list)


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
    return out["model_outputs"], segment_errors(out)


def _solo(stage: CosyVoice3Code2Wav, request: Request) -> torch.Tensor:
    pieces = []
    for chunk in request.chunks:
        audio, errors = _forward(stage, [chunk])
        assert errors == [None], errors
        pieces.append(audio[0])
    return torch.cat(pieces)


def test_randomised_schedule_equals_each_request_alone_and_the_facade(
    stages: tuple[CosyVoice3Code2Wav, CosyVoice3Code2Wav],
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
            widest = max([widest, *(len(launch.rows) for launch in batched.engine.last_plan.flow)])
            for r, a in zip(ready, audio, strict=True):
                r.audio.append(a)
                r.sent += 1
        step += 1
    assert widest >= 3 and batched.live_streams == 0
    for r in requests:
        got, alone = torch.cat(r.audio), _solo(solo, r)
        assert got.shape == alone.shape == (960 * len(r.tokens),), r.rid
        assert float((got - alone).abs().max()) <= TOLERANCE, r.rid
    # the stage's stream of a request is the facade's stream with the request's seed
    r = next(r for r in requests if r.prompt is not None and len(r.chunks) >= 3)
    core = batched.token2wav
    state = core.set_stream_cache(prompt=r.prompt, seed=batched.engine.noise_seed(r.rid, 0))
    ids = torch.tensor(r.tokens)
    facade = [
        core.stream(ids[part], last_chunk=last, return_waveform=True, state=state)
        for part, last in upstream_chunks(len(r.tokens), r.prompt.num_tokens)
    ]
    assert torch.equal(torch.cat(facade, dim=1)[0], torch.cat(r.audio))


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
    audio = out.multimodal_outputs["model_outputs"][0]
    expected = stage.token2wav(tokens, prompt=request.prompt, seed=stage.engine.noise_seed("sync", 0))
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
        pieces.append(out.multimodal_outputs["model_outputs"][0])
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


def test_the_vocoder_may_batch_rows_at_equal_positions(cv3_dir: Path) -> None:
    stage = CosyVoice3Code2Wav(model=str(cv3_dir), batch_vocoder=True, **OPTIONS)
    solo = CosyVoice3Code2Wav(model=str(cv3_dir), **OPTIONS)
    requests = [_talker_request(stage, f"v{i}", [(37 * i + k) % 6561 for k in range(80)], 0) for i in range(3)]
    for k in range(len(requests[0].chunks)):
        audio, errors = _forward(stage, [r.chunks[k] for r in requests])
        assert errors == [None] * 3
        assert [len(v.rows) for v in stage.engine.last_plan.vocoder] == [3]
        for r, a in zip(requests, audio, strict=True):
            r.audio.append(a)
    for r in requests:
        alone = _solo(solo, r)
        assert float((torch.cat(r.audio) - alone).abs().max()) <= TOLERANCE


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
