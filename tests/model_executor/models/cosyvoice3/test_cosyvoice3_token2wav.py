# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3 Token2Wav facade: token ids + prompt -> 24 kHz audio, whole and streamed, against references.

References are the independent re-implementations of the flow
(`tests/model_executor/layers/flow_cosyvoice3/reference.py`: one plain run per call, i.e. upstream's prefix
re-run when streaming) and of the causal HiFT (`tests/model_executor/layers/hift_causal/reference.py`, with
the noise drawn literally in the reference's RNG order). Checked stage by stage: the facade's mel
against the flow reference (<= 1e-5) and its audio against the reference vocoder on that mel
(<= 1e-6). The whole chain (reference flow -> reference vocoder) agrees only loosely: a 1e-6 mel
difference moves F0 and the voiced/unvoiced decisions of the sine source, which the vocoder turns into
up to ~1e-4 of audio at the stand-in's 0.02 peak (measured 9.4e-5), so that comparison is bounded by
relative L2 instead.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.stream_race import race
from tests.helpers.token2wav import SessionCounter, assert_embeddings_close, make_token2wav_dir
from tests.model_executor.layers.flow_cosyvoice3.reference import reference_mel
from tests.model_executor.layers.hift_causal.reference import reference_inference, reference_noise
from vllm_omni_token2wav.assets.audio import speech_sample
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import FinalChunk
from vllm_omni_token2wav.model_executor.models.cosyvoice3 import cosyvoice3_token2wav
from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_token2wav import (
    COSYVOICE3_ASSETS,
    CosyVoice3Token2Wav,
    upstream_chunks,
)
from vllm_omni_token2wav.model_executor.models.cosyvoice3.prompt import (
    CosyVoice3Prompt,
    read_prompt_tokens,
    voice_tokens_path,
)
from vllm_omni_token2wav.model_executor.models.cosyvoice3.synthesis import (
    StreamRow,
    flow_rows,
    open_stream,
    vocoder_rows,
)
from vllm_omni_token2wav.model_executor.models.speaker_embedding import selection as speaker_embedding
from vllm_omni_token2wav.model_executor.models.token2wav_core.assets import AssetDir
from vllm_omni_token2wav.model_executor.models.token2wav_core.core import Token2WavCore
from vllm_omni_token2wav.model_executor.models.token2wav_core.speaker_prompt import SpeakerPrompt
from vllm_omni_token2wav.model_executor.models.token2wav_core.stream import StreamInUseError

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]

N_STEPS = 2
MEL_ATOL = 1e-5
VOCODER_ATOL = 1e-6


@pytest.fixture(scope="module")
def core(cv3_dir: Path) -> CosyVoice3Token2Wav:
    return CosyVoice3Token2Wav(cv3_dir, device="cpu", n_timesteps=N_STEPS)


@pytest.fixture(scope="module")
def prompt(core: CosyVoice3Token2Wav, cv3_dir: Path) -> CosyVoice3Prompt:
    wav = cv3_dir / "default_voice.wav"
    return core.prompt(str(wav), read_prompt_tokens(voice_tokens_path(wav))[:, :40])


def _tokens(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 6561, (1, n), generator=torch.Generator().manual_seed(seed))


def _weights(core: CosyVoice3Token2Wav) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in core.flow.state_dict().items()}


def _ref_mel(
    core: CosyVoice3Token2Wav, prompt: CosyVoice3Prompt, ids: torch.Tensor, seed: int, **kw: bool
) -> torch.Tensor:
    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.noise import draw_noise_table

    return reference_mel(
        _weights(core),
        core.flow.config,
        prompt_ids=prompt.tokens,
        prompt_mel=prompt.mel,
        embedding=prompt.embedding,
        ids=ids,
        noise=draw_noise_table(seed),
        n_timesteps=N_STEPS,
        **kw,
    )


def _ref_vocoder(core: CosyVoice3Token2Wav, mel: torch.Tensor) -> torch.Tensor:
    origin = core.hift.noise.origin  # type: ignore[attr-defined]
    noise = reference_noise(origin.seed, origin.draws_before, mel.shape[-1] * 480)
    return reference_inference(core.hift, mel, noise)


def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_the_facade_owns_the_shared_components_instead_of_subclassing_the_core(core: CosyVoice3Token2Wav) -> None:
    assert not issubclass(CosyVoice3Token2Wav, Token2WavCore)
    assert isinstance(core.speaker_prompt, SpeakerPrompt) and isinstance(core.asset_dir, AssetDir)
    assert core.speaker_prompt.owner == core.asset_dir.owner == "CosyVoice3Token2Wav"
    assert core.speaker_prompt.mel_config is CosyVoice3Token2Wav.prompt_mel_config


def test_asset_names_and_the_missing_tokenizer(core: CosyVoice3Token2Wav) -> None:
    assert COSYVOICE3_ASSETS.speaker_model == "campplus.onnx"
    assert COSYVOICE3_ASSETS.flow_config == "cosyvoice3.yaml" and COSYVOICE3_ASSETS.flow == "flow.pt"
    assert CosyVoice3Token2Wav.assets is COSYVOICE3_ASSETS
    assert [p.name for p in core.check_assets()] == ["campplus.onnx", "flow.pt", "hift.pt", "cosyvoice3.yaml"]
    # speech_tokenizer_v3 is not in-tree: the facade says so by type, and has no speech_tokenizer member
    assert CosyVoice3Token2Wav.has_speech_tokenizer is False and not hasattr(core, "speech_tokenizer")


@pytest.mark.parametrize("seed", [0, 9])
def test_whole_utterance_from_token_ids_matches_the_reference_flow_and_vocoder(
    core: CosyVoice3Token2Wav, prompt: CosyVoice3Prompt, seed: int
) -> None:
    ids = _tokens(70)
    audio = core(ids, prompt=prompt, seed=seed)
    assert audio.shape == (1, 70 * 960) and audio.dtype == torch.float32
    mel = core.flow.inference(
        ids, 70, prompt.tokens, 40, prompt.mel, 80, prompt.embedding, n_timesteps=N_STEPS, noise_seed=seed
    )
    ref_mel = _ref_mel(core, prompt, ids, seed, streaming=False, finalize=True)
    assert (mel - ref_mel).abs().max().item() <= MEL_ATOL
    assert (audio - _ref_vocoder(core, mel)).abs().max().item() <= VOCODER_ATOL
    assert _rel_l2(audio, _ref_vocoder(core, ref_mel)) <= 1e-2


def test_streaming_on_upstreams_schedule_matches_the_prefix_reruns_and_the_vocoder(
    core: CosyVoice3Token2Wav, prompt: CosyVoice3Prompt
) -> None:
    ids, seed = _tokens(130, seed=2), 4
    caches = open_stream(core.flow, core.streamer, prompt, n_timesteps=N_STEPS, noise_seed=seed)
    mels, audio = [], []
    for part, last in upstream_chunks(130, prompt.num_tokens):
        row = StreamRow(caches, ids[:, part], last)
        flows = flow_rows(core.flow, [row])
        ((piece, caches),) = vocoder_rows(core.streamer, [row], flows)
        # upstream's `tts`: block-causal prefix re-runs, the last call with full attention (the default last chunk)
        ref = _ref_mel(core, prompt, ids[:, : part.stop], seed, streaming=not last, finalize=last)
        emitted = sum(m.shape[-1] for m in mels)
        assert (flows[0][0] - ref[:, :, emitted:]).abs().max().item() <= MEL_ATOL
        mels.append(flows[0][0])
        audio.append(piece)
    streamed = torch.cat(audio)
    assert len(mels) == 3 and streamed.shape == (130 * 960,)
    assert (streamed - _ref_vocoder(core, torch.cat(mels, dim=2))[0]).abs().max().item() <= VOCODER_ATOL
    # the facade's stream is one row of the same kernels
    state = core.set_stream_cache(prompt=prompt, seed=seed)
    facade = [
        core.stream(ids[0, part], last_chunk=last, return_waveform=True, state=state)
        for part, last in upstream_chunks(130, prompt.num_tokens)
    ]
    assert torch.equal(torch.cat(facade, dim=1)[0], streamed) and state.finished
    with pytest.raises(RuntimeError, match="already had its last chunk"):
        core.stream([1], state=state)


def test_the_last_chunk_is_upstreams_full_attention_by_default_and_block_causal_on_request(
    core: CosyVoice3Token2Wav, prompt: CosyVoice3Prompt, cv3_dir: Path
) -> None:
    """Default: upstream's last call (full attention); `FinalChunk.BLOCK_CAUSAL` still gives the block-causal final
    run. Every earlier chunk is the same computation in both modes, so only the last chunk's audio differs."""
    block_core = CosyVoice3Token2Wav(cv3_dir, device="cpu", n_timesteps=N_STEPS, final_chunk=FinalChunk.BLOCK_CAUSAL)
    assert core.final_chunk is FinalChunk.FULL_ATTENTION and block_core.final_chunk is FinalChunk.BLOCK_CAUSAL
    ids, seed = _tokens(90, seed=5), 3
    parts = list(upstream_chunks(90, prompt.num_tokens))
    assert len(parts) >= 2
    streamed: dict[FinalChunk, list[torch.Tensor]] = {}
    for facade, upstream_final_streaming in ((core, False), (block_core, True)):
        state = facade.set_stream_cache(prompt=prompt, seed=seed)
        assert state.caches.flow.final_chunk is facade.final_chunk
        pieces = [
            facade.stream(ids[0, part], last_chunk=last, return_waveform=True, state=state)[0] for part, last in parts
        ]
        streamed[facade.final_chunk] = pieces
        # the same stream through the synthesis rows, its last chunk's mel against the reference of its mode
        caches = open_stream(
            facade.flow, facade.streamer, prompt, n_timesteps=N_STEPS, noise_seed=seed, final_chunk=facade.final_chunk
        )
        mels, audio = [], []
        for part, last in parts:
            row = StreamRow(caches, ids[:, part], last)
            flows = flow_rows(facade.flow, [row])
            ((piece, caches),) = vocoder_rows(facade.streamer, [row], flows)
            mels.append(flows[0][0])
            audio.append(piece)
        ref = _ref_mel(facade, prompt, ids, seed, streaming=upstream_final_streaming, finalize=True)
        emitted = sum(m.shape[-1] for m in mels[:-1])
        assert (mels[-1] - ref[:, :, emitted:]).abs().max().item() <= MEL_ATOL, facade.final_chunk
        assert torch.equal(torch.cat(audio), torch.cat(pieces))
    full, block = streamed[FinalChunk.FULL_ATTENTION], streamed[FinalChunk.BLOCK_CAUSAL]
    assert all(torch.equal(a, b) for a, b in zip(full[:-1], block[:-1], strict=True))
    assert full[-1].shape == block[-1].shape and not torch.allclose(full[-1], block[-1], atol=1e-5, rtol=0)


def test_noise_is_seeded_per_request(core: CosyVoice3Token2Wav, prompt: CosyVoice3Prompt) -> None:
    ids = _tokens(20, seed=3)
    a, b, c = core(ids, prompt=prompt, seed=1), core(ids, prompt=prompt, seed=1), core(ids, prompt=prompt, seed=2)
    assert torch.equal(a, b) and not torch.allclose(a, c)


def test_bad_input_is_an_error_naming_the_problem(core: CosyVoice3Token2Wav, prompt: CosyVoice3Prompt) -> None:
    wav, rate = speech_sample()
    with pytest.raises(ValueError, match=r"speech token id 6561 is outside \[0, 6561\)"):
        core([1, 6561, 2], prompt=prompt)
    with pytest.raises(ValueError, match="no speech tokens to synthesise"):
        core([], prompt=prompt)
    with pytest.raises(ValueError, match="at most 750"):
        core.prompt((wav, rate), list(range(751)))
    with pytest.raises(ValueError, match=r"over the 30 s prompt limit"):
        core.prompt((np.tile(wav, 9), rate), list(range(10)))
    with pytest.raises(ValueError, match="audio AND its speech tokens"):
        core([1, 2], (wav, rate))
    with pytest.raises(ValueError, match=r"15040 mel frames .* noise table holds 15000"):
        core(torch.zeros(1, 7480, dtype=torch.long), prompt=prompt)
    state = core.set_stream_cache(prompt=prompt)
    with pytest.raises(ValueError, match="speech token id 7000"):
        core.stream([1, 7000], state=state)
    assert state.caches.received == 0  # the failed chunk left the stream as it was


def test_a_click_in_silence_is_not_a_reference_voice(core: CosyVoice3Token2Wav) -> None:
    click = np.zeros(16000, np.float32)
    click[8000] = 0.5
    for call in (
        lambda: core.prompt((click, 16000), list(range(25))),
        lambda: core.speaker_embedding((click, 16000)),
        lambda: core.set_stream_cache((click, 16000), prompt_tokens=list(range(25))),
        lambda: core([1, 2, 3], (click, 16000), prompt_tokens=list(range(25))),
    ):
        with pytest.raises(ValueError, match=r"<array>: prompt has 0\.03 s of sustained signal .* below the 0\.3 s"):
            call()


def test_a_chunk_while_another_chunk_of_the_same_stream_runs_is_refused(
    core: CosyVoice3Token2Wav, prompt: CosyVoice3Prompt, monkeypatch: pytest.MonkeyPatch
) -> None:
    """8 threads call `stream(state=one_stream)` at once, the first chunk held until the others returned
    (tests/helpers/stream_race.py): one gets its solo audio, seven the clear error, the stream stays intact."""
    ids = _tokens(130, seed=6)
    parts = list(upstream_chunks(130, prompt.num_tokens))
    solo_state = core.set_stream_cache(prompt=prompt, seed=5)
    solo = [core.stream(ids[0, part], last_chunk=last, return_waveform=True, state=solo_state) for part, last in parts]
    shared = core.set_stream_cache(prompt=prompt, seed=5)
    first = ids[0, parts[0][0]]
    result = race(
        [lambda: core.stream(first, last_chunk=False, return_waveform=True, state=shared)] * 8,
        module=cosyvoice3_token2wav,
        computation="stream_rows",
        monkeypatch=monkeypatch,
    )
    winners = [out for out in result.outputs if out is not None]
    refused = [exc for exc in result.errors if exc is not None]
    assert len(winners) == 1 and torch.equal(winners[0], solo[0])
    assert len(refused) == 7 and all(isinstance(exc, StreamInUseError) for exc in refused), refused
    assert all("set_stream_cache(prompt_wav)" in str(exc) and "state=" in str(exc) for exc in refused)
    assert shared.chunks_done == 1
    rest: list[torch.Tensor] = []  # sequential use from another thread (a worker pool) stays fine

    def finish() -> None:
        for part, last in parts[1:]:
            piece = core.stream(ids[0, part], last_chunk=last, return_waveform=True, state=shared)
            assert isinstance(piece, torch.Tensor)
            rest.append(piece)

    worker = threading.Thread(target=finish)
    worker.start()
    worker.join()
    assert len(rest) == len(solo) - 1 and all(torch.equal(a, b) for a, b in zip(rest, solo[1:], strict=True))


def test_a_hift_section_that_does_not_describe_hift_pt_is_an_error(cv3_dir: Path, tmp_path: Path) -> None:
    for name in ("campplus.onnx", "flow.pt", "hift.pt"):
        (tmp_path / name).symlink_to(cv3_dir / name)
    text = (cv3_dir / "cosyvoice3.yaml").read_text().replace("nsf_voiced_threshold: 10", "nsf_voiced_threshold: 5")
    (tmp_path / "cosyvoice3.yaml").write_text(text)
    with pytest.raises(ValueError, match=r"nsf_voiced_threshold: yaml 5.0, hift.pt / in-tree 10.0"):
        CosyVoice3Token2Wav(tmp_path, device="cpu").load_models()


# ---- the speaker path (the facade before synthesis existed): laziness and backends ------------------------


def test_device_switch_is_lazy_and_embeds_on_the_torch_path(cv3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(speaker_embedding, "CPU_DEVICE_PATH_BACKEND", "torch")
    counter = SessionCounter(monkeypatch)
    facade = CosyVoice3Token2Wav(cv3_dir, device="cpu")
    assert facade.enable_device_spk_embedding().startswith("torch-cpu")
    facade.load_models()
    wav, rate = speech_sample()
    features = facade.prepare_prompt((wav[:rate], rate))
    assert features.speaker_embedding.shape == (1, 192) and features.backend.startswith("torch-cpu")
    assert counter.count == 0


def test_fallback_embedding_matches_onnxruntime_on_the_same_features(tmp_path: Path) -> None:
    import onnxruntime

    from vllm_omni_token2wav.model_executor.models import audio as frontend
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.features import speaker_features

    directory = make_token2wav_dir(tmp_path / "cv3")
    wav, rate = speech_sample()
    wav = wav[: 2 * rate].copy()
    features = speaker_features(torch.from_numpy(frontend.load_audio((wav, rate), 16000).numpy()))
    session = onnxruntime.InferenceSession(str(directory / "campplus.onnx"), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {session.get_inputs()[0].name: features[None].numpy()})
    got = CosyVoice3Token2Wav(directory).speaker_embedding((wav, rate))
    assert_embeddings_close(got, expected)


def test_missing_speaker_model_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "flow.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"campplus\.onnx is missing"):
        CosyVoice3Token2Wav(tmp_path).enable_device_spk_embedding()
