# SPDX-License-Identifier: Apache-2.0
"""End-to-end Token2Wav synthesis on the reduced stand-in: whole utterance, streaming, isolation, bad input.

References are independent of the facade: the whole-utterance path is recomposed from the loaded
models and the front end; the streaming path is re-driven chunk by chunk with the reference's
vocoder rules written out here in NumPy (float64 `np.hamming` cross-fade, 8-frame mel cache, 3840
source samples). Stand-in weights are random, so audio is noise-like but deterministic.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.stream_race import race
from tests.helpers.torch_state import one_intra_op_thread
from vllm_omni_token2wav.model_executor.models import audio as frontend
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_token2wav import MiniCPMO45Token2wav
from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav import StepAudio2Token2WavCore
from vllm_omni_token2wav.model_executor.models.token2wav_core import core as token2wav_core_module
from vllm_omni_token2wav.model_executor.models.token2wav_core.prompt_features import fit_mel_to_tokens
from vllm_omni_token2wav.model_executor.models.token2wav_core.stream import (
    StreamInUseError,
    Token2WavStream,
    stream_chunks,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]

N_STEPS = 2
SAMPLES_PER_TOKEN = 960  # 2 mel frames x 480 samples


def _tokens(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 6561, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def core(token2wav_dir: Path) -> StepAudio2Token2WavCore:
    return StepAudio2Token2WavCore(token2wav_dir, device="cpu", n_timesteps=N_STEPS)


@pytest.fixture(scope="module")
def prompt(short_speech: tuple[np.ndarray, int]) -> tuple[np.ndarray, int]:
    return short_speech


@pytest.fixture(scope="module")
def other_prompt(speech: tuple[np.ndarray, int]) -> tuple[np.ndarray, int]:
    wav, rate = speech
    return wav[2 * rate : 4 * rate].copy(), rate


def _run_stream(core: StepAudio2Token2WavCore, state: Token2WavStream, tokens: list[int]) -> list[torch.Tensor]:
    out = []
    for chunk, last in stream_chunks(tokens):
        piece = core.stream(chunk, last_chunk=last, return_waveform=True, state=state)
        assert isinstance(piece, torch.Tensor)
        out.append(piece)
    return out


# ---- prompt features with tokens ----------------------------------------------------------------


def test_prompt_tokens_come_from_the_speech_tokenizer_and_fit_the_mel(
    core: StepAudio2Token2WavCore, prompt: tuple[np.ndarray, int]
) -> None:
    features = core.prepare_prompt(prompt, with_tokens=True)
    audio = frontend.load_prompt_audio(prompt)
    codes, count = core.speech_tokenizer.tokenize(audio.wav_16k)
    assert features.prompt_tokens is not None and features.prompt_token_len is not None
    assert torch.equal(features.prompt_tokens, codes.reshape(1, -1).to(torch.int32))
    assert int(features.prompt_token_len[0]) == count == 38  # 150 mel frames -> 75 -> 38 after two stride-2 convs
    raw_mel = frontend.prompt_mel_24k(audio.wav_24k)
    assert features.prompt_mel.shape == (1, 2 * count, 80) and int(features.prompt_mel_len[0]) == 2 * count
    n = min(raw_mel.shape[1], 2 * count)
    torch.testing.assert_close(features.prompt_mel[:, :n], raw_mel[:, :n], rtol=0, atol=0)
    torch.testing.assert_close(features.prompt_mel[:, n:], raw_mel[:, -1:].expand(1, 2 * count - n, 80))
    speaker_only = core.prepare_prompt(prompt)
    assert speaker_only.prompt_tokens is None
    torch.testing.assert_close(speaker_only.speaker_embedding, features.speaker_embedding, rtol=0, atol=0)


def test_fit_mel_to_tokens_pads_with_the_last_frame_or_cuts() -> None:
    mel = torch.arange(5 * 80, dtype=torch.float32).reshape(1, 5, 80)
    padded = fit_mel_to_tokens(mel, 4)
    assert padded.shape == (1, 8, 80) and torch.equal(padded[:, 5:], mel[:, 4:5].expand(1, 3, 80))
    assert torch.equal(fit_mel_to_tokens(mel, 2), mel[:, :4])
    with pytest.raises(ValueError, match="no frames"):
        fit_mel_to_tokens(mel[:, :0], 2)


def test_onnx_and_torch_tokenizers_give_the_same_prompt_tokens(
    token2wav_dir: Path, core: StepAudio2Token2WavCore, prompt: tuple[np.ndarray, int]
) -> None:
    torch_core = StepAudio2Token2WavCore(
        token2wav_dir, device="cpu", n_timesteps=N_STEPS, speech_tokenizer_backend="torch"
    )
    assert core.speech_tokenizer.name != torch_core.speech_tokenizer.name  # auto picks onnxruntime on CPU
    a = core.prepare_prompt(prompt, with_tokens=True).prompt_tokens
    b = torch_core.prepare_prompt(prompt, with_tokens=True).prompt_tokens
    assert a is not None and b is not None and torch.equal(a, b)


# ---- whole utterance ------------------------------------------------------------------------------


def test_whole_utterance_equals_flow_then_hift_on_the_prompt_features(
    core: StepAudio2Token2WavCore, prompt: tuple[np.ndarray, int]
) -> None:
    tokens = _tokens(40)
    wav = core(tokens, prompt)
    assert wav.shape == (1, SAMPLES_PER_TOKEN * 40) and wav.dtype == torch.float32
    assert bool(torch.isfinite(wav).all()) and float(wav.abs().max()) > 0
    f = core.prepare_prompt(prompt, with_tokens=True)
    ids = torch.tensor([tokens], dtype=torch.int32)
    with torch.inference_mode():
        mel = core.flow.inference(
            ids,
            torch.tensor([40]),
            f.prompt_tokens,
            f.prompt_token_len,
            f.prompt_mel,
            f.prompt_mel_len,
            f.speaker_embedding,
            n_timesteps=N_STEPS,
        )
        expected, _ = core.hift(mel, generator=torch.Generator().manual_seed(core.seed))
    torch.testing.assert_close(wav, expected, rtol=0, atol=0)


def test_whole_utterance_is_reproducible_and_the_seed_only_moves_the_noise(
    core: StepAudio2Token2WavCore, prompt: tuple[np.ndarray, int]
) -> None:
    tokens = _tokens(20, seed=3)
    first, again = core(tokens, prompt), core(tokens, prompt)
    assert torch.equal(first, again)
    other = core(tokens, prompt, seed=7)
    assert not torch.equal(first, other)
    # The NSF noise is small against the harmonic source: same mel, slightly different audio.
    assert float((first - other).abs().max()) < float(first.abs().max())


def test_token_forms_are_equivalent(core: StepAudio2Token2WavCore, prompt: tuple[np.ndarray, int]) -> None:
    tokens = _tokens(12, seed=5)
    as_list = core(tokens, prompt)
    assert torch.equal(core(np.array(tokens, dtype=np.int64), prompt), as_list)
    assert torch.equal(core(torch.tensor([tokens], dtype=torch.int32), prompt), as_list)


# ---- streaming -----------------------------------------------------------------------------------


@torch.inference_mode()
def _reference_stream(
    core: StepAudio2Token2WavCore, prompt: tuple[np.ndarray, int], tokens: list[int]
) -> list[np.ndarray]:
    """The reference's streaming driver, written out: flow chunks, 8-frame mel cache, np.hamming fade."""
    f = core.prepare_prompt(prompt, with_tokens=True)
    head = f.prompt_tokens[:, :3]
    cache = core.flow.setup_cache(
        torch.cat([f.prompt_tokens, head], dim=1), f.prompt_mel, f.speaker_embedding, n_timesteps=N_STEPS
    )
    window = np.hamming(2 * 3840)
    generator = torch.Generator().manual_seed(core.seed)
    mel_cache, source_cache, speech_cache = torch.zeros(1, 80, 0), torch.zeros(1, 1, 0), np.zeros(0)
    pieces = []
    for chunk, last in stream_chunks(tokens):
        chunk_mel, cache = core.flow.inference_chunk(
            torch.tensor([chunk], dtype=torch.int32), f.speaker_embedding, cache, last_chunk=last, n_timesteps=N_STEPS
        )
        mel = torch.cat([mel_cache, chunk_mel], dim=2)
        speech_t, source = core.hift(mel, source_cache, generator=generator)
        speech = speech_t[0].numpy().astype(np.float64)
        if speech_cache.size:
            speech[:3840] = speech[:3840] * window[:3840] + speech_cache * window[3840:]
        speech = speech.astype(np.float32)
        mel_cache, source_cache, speech_cache = mel[..., -8:], source[..., -3840:], speech[-3840:].astype(np.float64)
        pieces.append(speech if last else speech[:-3840])
    return pieces


def test_streaming_matches_the_reference_driver_and_the_whole_length(
    core: StepAudio2Token2WavCore, prompt: tuple[np.ndarray, int]
) -> None:
    tokens = _tokens(80, seed=1)  # chunks of 28, 28, 28, 5 tokens: 25, 25, 25, 5 emitted
    state = core.set_stream_cache(prompt)
    got = _run_stream(core, state, tokens)
    expected = _reference_stream(core, prompt, tokens)
    lengths = [25 * 960 - 3840, 25 * 960, 25 * 960, 5 * 960 + 3840]
    assert [p.shape[1] for p in got] == [p.shape[0] for p in expected] == lengths
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a[0].numpy(), b, rtol=0, atol=1e-6)
    total = torch.cat(got, dim=1)
    assert total.shape[1] == SAMPLES_PER_TOKEN * len(tokens) == state.samples_emitted
    assert bool(torch.isfinite(total).all()) and state.finished and state.chunks_done == 4


def test_stream_joins_are_no_rougher_than_the_audio_around_them(
    core: StepAudio2Token2WavCore, prompt: tuple[np.ndarray, int]
) -> None:
    state = core.set_stream_cache(prompt)
    pieces = _run_stream(core, state, _tokens(80, seed=2))
    audio = torch.cat(pieces, dim=1)[0].double()
    jumps = audio.diff().abs()
    join = 0
    for piece in pieces[:-1]:
        join += piece.shape[1]
        around = torch.cat([jumps[join - 3840 : join - 2], jumps[join + 1 : join + 3840]])
        assert float(jumps[join - 1]) <= float(around.max()), f"discontinuity at sample {join}"


def test_pcm_output_is_the_clipped_int16_of_the_waveform(
    core: StepAudio2Token2WavCore, prompt: tuple[np.ndarray, int]
) -> None:
    tokens = _tokens(10, seed=4)
    wave = core.stream(tokens, last_chunk=True, return_waveform=True, state=core.set_stream_cache(prompt))
    pcm = core.stream(tokens, last_chunk=True, state=core.set_stream_cache(prompt))
    assert isinstance(pcm, bytes) and isinstance(wave, torch.Tensor)
    expected = (np.clip(wave[0].numpy(), -1, 1) * 32767.0).astype("<i2")
    assert np.array_equal(np.frombuffer(pcm, dtype="<i2"), expected)


def test_interleaved_streams_equal_streams_run_alone(
    core: StepAudio2Token2WavCore, prompt: tuple[np.ndarray, int], other_prompt: tuple[np.ndarray, int]
) -> None:
    tokens_a, tokens_b = _tokens(60, seed=10), _tokens(60, seed=11)
    alone_a = _run_stream(core, core.set_stream_cache(prompt), tokens_a)
    alone_b = _run_stream(core, core.set_stream_cache(other_prompt), tokens_b)
    state_a, state_b = core.set_stream_cache(prompt), core.set_stream_cache(other_prompt)
    chunks_a, chunks_b = list(stream_chunks(tokens_a)), list(stream_chunks(tokens_b))
    got_a, got_b = [], []
    for (ca, la), (cb, lb) in zip(chunks_a, chunks_b, strict=True):
        got_a.append(core.stream(ca, last_chunk=la, return_waveform=True, state=state_a))
        core(_tokens(5, seed=99), prompt)  # a whole-utterance request in between must not disturb them
        got_b.append(core.stream(cb, last_chunk=lb, return_waveform=True, state=state_b))
    for got, alone in ((got_a, alone_a), (got_b, alone_b)):
        assert all(torch.equal(x, y) for x, y in zip(got, alone, strict=True))


def test_concurrent_streams_in_threads_equal_streams_run_alone(
    core: StepAudio2Token2WavCore, prompt: tuple[np.ndarray, int], other_prompt: tuple[np.ndarray, int]
) -> None:
    jobs = [(prompt, _tokens(40, seed=20)), (other_prompt, _tokens(40, seed=21))]
    alone = [torch.cat(_run_stream(core, core.set_stream_cache(p), t), dim=1) for p, t in jobs]
    results: list[torch.Tensor | None] = [None, None]

    def run(i: int) -> None:
        p, t = jobs[i]
        results[i] = torch.cat(_run_stream(core, core.set_stream_cache(p), t), dim=1)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(r is not None and torch.equal(r, a) for r, a in zip(results, alone, strict=True))


def test_the_post_prompt_flow_cache_is_computed_once_per_prompt(
    core: StepAudio2Token2WavCore, prompt: tuple[np.ndarray, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    core._setup_cache.clear()
    calls = []
    real = type(core.flow).setup_cache
    monkeypatch.setattr(type(core.flow), "setup_cache", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    first, second = core.set_stream_cache(prompt), core.set_stream_cache(prompt)
    assert len(calls) == 1 and first.flow_cache is second.flow_cache and first is not second


def test_the_upstream_single_stream_api_uses_the_last_set_up_stream(
    token2wav_dir: Path, prompt: tuple[np.ndarray, int]
) -> None:
    fresh = StepAudio2Token2WavCore(token2wav_dir, device="cpu", n_timesteps=N_STEPS)
    with pytest.raises(RuntimeError, match="call set_stream_cache"):
        fresh.stream(_tokens(28), prompt)
    state = fresh.set_stream_cache(prompt)
    tokens = _tokens(40, seed=6)
    via_default = [fresh.stream(c, prompt, last, True) for c, last in stream_chunks(tokens)]
    assert state.finished
    explicit = _run_stream(fresh, fresh.set_stream_cache(prompt), tokens)
    assert all(torch.equal(a, b) for a, b in zip(via_default, explicit, strict=True))  # type: ignore[arg-type]


# ---- concurrent misuse of one stream ---------------------------------------------------------------


def _is_clear_refusal(exc: BaseException | None) -> bool:
    """The error concurrent misuse must get: StreamInUseError naming the fix."""
    text = str(exc)
    return isinstance(exc, StreamInUseError) and "set_stream_cache(prompt_wav)" in text and "state=" in text


@pytest.mark.parametrize("facade_type", [StepAudio2Token2WavCore, MiniCPMO45Token2wav])
def test_eight_threads_on_a_facades_default_stream_get_their_solo_audio_or_a_clear_error(
    token2wav_dir: Path,
    prompt: tuple[np.ndarray, int],
    other_prompt: tuple[np.ndarray, int],
    facade_type: type[StepAudio2Token2WavCore | MiniCPMO45Token2wav],
) -> None:
    """Upstream-style callers in 8 threads: `set_stream_cache(voice)`, then `stream(chunk, voice)` without
    `state=`. Each call returns exactly the audio of its request run alone, or raises the clear error
    (and its caller stops); never another request's audio."""
    with one_intra_op_thread():  # 8 callers on 2 cores without OpenMP peers spinning on top of them
        _eight_callers_on_the_default_stream(
            facade_type(token2wav_dir, device="cpu", n_timesteps=N_STEPS), [prompt, other_prompt]
        )


def _eight_callers_on_the_default_stream(
    facade: StepAudio2Token2WavCore | MiniCPMO45Token2wav, voices: list[tuple[np.ndarray, int]]
) -> None:
    jobs = [(voices[i % 2], _tokens(40, seed=30 + i)) for i in range(8)]  # 2 chunks each
    solo = []
    for p, t in jobs:
        state = facade.set_stream_cache(p)
        solo.append([facade.stream(c, None, last, True, state=state) for c, last in stream_chunks(t)])
    barrier = threading.Barrier(len(jobs))
    got: list[list[object]] = [[] for _ in jobs]
    errors: list[BaseException | None] = [None] * len(jobs)

    def run(i: int) -> None:
        p, t = jobs[i]
        barrier.wait()
        try:
            facade.set_stream_cache(p)
            for chunk, last in stream_chunks(t):
                got[i].append(facade.stream(chunk, p, last, True))
        except BaseException as exc:  # noqa: BLE001 - every outcome is checked below
            errors[i] = exc

    threads = [threading.Thread(target=run, args=(i,), name=f"caller-{i}") for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in range(len(jobs)):
        assert errors[i] is None or _is_clear_refusal(errors[i]), (i, errors[i])
        assert len(got[i]) == len(solo[i]) if errors[i] is None else len(got[i]) < len(solo[i])
        for k, audio in enumerate(got[i]):
            assert isinstance(audio, torch.Tensor) and torch.equal(audio, solo[i][k]), f"thread {i} chunk {k}"
    assert errors.count(None) >= 1  # the last thread to set up the default stream keeps it to the end
    # Sequential use of the default stream, in the thread that set it up, stays fine.
    p, t = jobs[3]
    facade.set_stream_cache(p)
    again = [facade.stream(c, p, last, True) for c, last in stream_chunks(t)]
    assert all(torch.equal(a, b) for a, b in zip(again, solo[3], strict=True))  # type: ignore[arg-type]


def test_the_default_stream_serves_the_thread_that_set_it_up(
    token2wav_dir: Path, prompt: tuple[np.ndarray, int]
) -> None:
    fresh = StepAudio2Token2WavCore(token2wav_dir, device="cpu", n_timesteps=N_STEPS)
    state = fresh.set_stream_cache(prompt)
    chunk = _tokens(28, seed=8)
    caught: list[BaseException] = []

    def other() -> None:
        try:
            fresh.stream(chunk, prompt)
        except BaseException as exc:  # noqa: BLE001
            caught.append(exc)

    thread = threading.Thread(target=other, name="not-the-owner")
    thread.start()
    thread.join()
    assert len(caught) == 1 and _is_clear_refusal(caught[0])
    assert "in thread 'not-the-owner'" in str(caught[0]) and f"in thread {threading.current_thread().name!r}" in str(
        caught[0]
    )
    assert state.chunks_done == 0  # refused before anything ran
    fresh.stream(chunk, prompt)  # the thread that set it up streams on
    assert state.chunks_done == 1


def test_a_chunk_while_another_chunk_of_the_same_stream_runs_is_refused(
    core: StepAudio2Token2WavCore, prompt: tuple[np.ndarray, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """8 threads call `stream(state=one_stream)` at once; the first chunk is held until the others
    returned (tests/helpers/stream_race.py), so they meet a running chunk for certain."""
    tokens = _tokens(60, seed=40)
    chunks = list(stream_chunks(tokens))
    solo = _run_stream(core, core.set_stream_cache(prompt), tokens)
    shared = core.set_stream_cache(prompt)
    first = chunks[0][0]
    result = race(
        [lambda: core.stream(first, last_chunk=False, return_waveform=True, state=shared)] * 8,
        module=token2wav_core_module,
        computation="stream_chunk",
        monkeypatch=monkeypatch,
    )
    winners = [out for out in result.outputs if out is not None]
    refused = [exc for exc in result.errors if exc is not None]
    assert len(winners) == 1 and torch.equal(winners[0], solo[0])
    assert len(refused) == 7 and all(_is_clear_refusal(exc) for exc in refused), refused
    assert all("already running a chunk in thread 'race-" in str(exc) for exc in refused)
    assert shared.chunks_done == 1
    # The refused calls left the stream intact; between chunks it may move to another thread (a pool).
    rest: list[torch.Tensor] = []
    worker = threading.Thread(target=lambda: rest.extend(_run_stream_from(core, shared, chunks[1:])))
    worker.start()
    worker.join()
    assert len(rest) == len(solo) - 1 and all(torch.equal(a, b) for a, b in zip(rest, solo[1:], strict=True))


def _run_stream_from(
    core: StepAudio2Token2WavCore, state: Token2WavStream, chunks: list[tuple[list[int], bool]]
) -> list[torch.Tensor]:
    out = []
    for chunk, last in chunks:
        piece = core.stream(chunk, last_chunk=last, return_waveform=True, state=state)
        assert isinstance(piece, torch.Tensor)
        out.append(piece)
    return out


# ---- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "match"),
    [
        pytest.param([], "empty token list", id="empty"),
        pytest.param([1, 2, 6561], r"6561 at position 2 is outside \[0, 6561\)", id="too-large"),
        pytest.param([5, -1], r"-1 at position 1", id="negative"),
        pytest.param([1.5, 2.0], "must be integers", id="float"),
        pytest.param(torch.zeros(2, 5, dtype=torch.int64), r"1-D \(or \[1, T\]\)", id="batch-of-2"),
        pytest.param(["a", "b"], "sequence of ints", id="strings"),
    ],
)
def test_bad_tokens_are_rejected_by_both_paths(
    core: StepAudio2Token2WavCore, prompt: tuple[np.ndarray, int], tokens: object, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        core(tokens, prompt)  # type: ignore[arg-type]
    state = core.set_stream_cache(prompt)
    with pytest.raises(ValueError, match=match):
        core.stream(tokens, last_chunk=True, state=state)  # type: ignore[arg-type]


def test_stream_errors_are_clear_and_leave_the_request_resumable(
    core: StepAudio2Token2WavCore, prompt: tuple[np.ndarray, int], other_prompt: tuple[np.ndarray, int]
) -> None:
    tokens = _tokens(60, seed=12)
    expected = _run_stream(core, core.set_stream_cache(prompt), tokens)
    state, bystander = core.set_stream_cache(prompt), core.set_stream_cache(other_prompt)
    bystander_caches, bystander_chunks = bystander.caches, bystander.chunks_done
    got = []
    for i, (chunk, last) in enumerate(stream_chunks(tokens)):
        if i == 1:
            with pytest.raises(ValueError, match="outside"):
                core.stream(chunk[:-1] + [7000], last_chunk=last, state=state)
            with pytest.raises(ValueError, match="at least 4 tokens plus 3 lookahead"):
                core.stream(chunk[:6], last_chunk=False, state=state)
            with pytest.raises(ValueError, match="not the prompt this stream was set up with"):
                core.stream(chunk, other_prompt, last_chunk=last, state=state)
        got.append(core.stream(chunk, prompt, last_chunk=last, return_waveform=True, state=state))
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert bystander.caches is bystander_caches and bystander.chunks_done == bystander_chunks
    with pytest.raises(RuntimeError, match="already had its last chunk"):
        core.stream(tokens[:5], last_chunk=True, state=state)


def test_a_prompt_too_long_for_the_streaming_caches_is_rejected_at_setup(
    core: StepAudio2Token2WavCore, speech: tuple[np.ndarray, int]
) -> None:
    wav, rate = speech
    long_prompt = (np.tile(wav, 5)[: 18 * rate].copy(), rate)
    with pytest.raises(ValueError, match=r"900 mel frames \(18\.0 s\) but streaming holds at most 844"):
        core.set_stream_cache(long_prompt)
    assert core(_tokens(4), long_prompt).shape == (1, 4 * SAMPLES_PER_TOKEN)  # whole utterances have no such cap


def test_float16_flow_still_gives_fp32_audio_on_both_paths(token2wav_dir: Path, prompt: tuple[np.ndarray, int]) -> None:
    half = StepAudio2Token2WavCore(token2wav_dir, device="cpu", n_timesteps=N_STEPS, float16=True)
    tokens = _tokens(33, seed=8)
    whole = half(tokens, prompt)
    streamed = torch.cat(_run_stream(half, half.set_stream_cache(prompt), tokens), dim=1)
    assert half.flow.dtype == torch.float16 and {p.dtype for p in half.hift.parameters()} == {torch.float32}
    for audio in (whole, streamed):
        assert audio.dtype == torch.float32 and audio.shape == (1, 33 * SAMPLES_PER_TOKEN)
        assert bool(torch.isfinite(audio).all())


def test_passing_the_setup_path_with_every_chunk_decodes_nothing(
    core: StepAudio2Token2WavCore, prompt: tuple[np.ndarray, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    import soundfile

    path = tmp_path / "voice.wav"
    soundfile.write(path, prompt[0], prompt[1], subtype="FLOAT")
    state = core.set_stream_cache(str(path))
    decodes = []
    real = frontend.decode_audio
    monkeypatch.setattr(frontend, "decode_audio", lambda *a, **k: decodes.append(1) or real(*a, **k))
    chunks = list(stream_chunks(_tokens(60, seed=13)))
    core.stream(chunks[0][0], str(path), chunks[0][1], True, state=state)
    core.stream(chunks[1][0], path, chunks[1][1], True, state=state)  # same file as a Path
    assert decodes == []
    copy = shutil.copy(path, tmp_path / "same-voice.wav")  # same content elsewhere: compared by content
    core.stream(chunks[2][0], str(copy), chunks[2][1], True, state=state)
    assert decodes == [1] and state.finished


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda ids: np.array(ids, dtype=np.uint64), id="numpy-uint64"),
        pytest.param(lambda ids: np.array(ids, dtype=np.uint32), id="numpy-uint32"),
        pytest.param(lambda ids: [np.uint64(i) for i in ids], id="list-of-uint64-scalars"),
        pytest.param(lambda ids: torch.tensor(ids, dtype=torch.uint64), id="torch-uint64"),
        pytest.param(lambda ids: np.array([ids], dtype=np.uint16), id="numpy-uint16-1xT"),
    ],
)
def test_unsigned_token_ids_are_accepted_and_range_checked(make: object) -> None:
    from vllm_omni_token2wav.model_executor.models.token2wav_core.synthesis import speech_token_tensor

    ids = [0, 17, 6560, 3]
    got = speech_token_tensor(make(ids), 6561, torch.device("cpu"), what="t")  # type: ignore[operator]
    assert got.dtype == torch.int32 and got.tolist() == [ids]
    with pytest.raises(ValueError, match=r"t: speech token 6561 at position 2 is outside \[0, 6561\)"):
        speech_token_tensor(make([1, 2, 6561, 9]), 6561, torch.device("cpu"), what="t")  # type: ignore[operator]


def test_uint64_ids_beyond_int64_are_reported_not_wrapped(
    core: StepAudio2Token2WavCore, prompt: tuple[np.ndarray, int]
) -> None:
    huge = np.array([5, 2**64 - 1], dtype=np.uint64)
    with pytest.raises(ValueError, match=rf"speech token {2**64 - 1} at position 1 is outside"):
        core(huge, prompt)


def test_a_state_that_is_not_a_stream_is_a_clear_type_error(core: StepAudio2Token2WavCore) -> None:
    for bad in ("request-7", {"flow_cache": None}):
        with pytest.raises(TypeError, match=r"state must be the Token2WavStream that set_stream_cache\(\) returned"):
            core.stream(_tokens(10, seed=1), last_chunk=True, state=bad)  # type: ignore[arg-type]
