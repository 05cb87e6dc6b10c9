# SPDX-License-Identifier: Apache-2.0
"""From the prompt's samples on the host to the stage's audio, nothing waits for the device.

The device is faked by `meta` (shapes, no values) under `tests/helpers/host_sync.HostSyncCounter`,
which records every operation that would synchronise a real accelerator: scalar reads, data-dependent
shapes, device -> host copies, blocking host -> device copies, Python reads of tensor data. The path:

- host (inherent, before the copy): decoding, resampling, the level / length / finiteness checks of
  `audio.load_prompt_audio`; the token-range check of chunk ids that arrive from the runner;
- device, counted here: fbank, CAM++ (torch), the 24 kHz prompt mel, the speech tokenizer, the
  flow's post-prompt setup, a batched flow launch, the HiFT network on noise drawn ahead; and the
  whole-reply path (flow over prompt + reply, HiFT).

Each check is paired with a regression that puts one synchronisation back and must be caught.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.helpers.host_sync import HostSyncCounter
from tests.helpers.torch_state import one_intra_op_thread
from vllm_omni_token2wav.assets.audio import speech_sample
from vllm_omni_token2wav.model_executor.layers.flow.batched import FlowChunkRow, flow_chunks
from vllm_omni_token2wav.model_executor.layers.hift.source import DrawnNoise
from vllm_omni_token2wav.model_executor.models.audio import load_prompt_audio
from vllm_omni_token2wav.model_executor.models.speaker_embedding import torch_backend as speaker_embedding_torch
from vllm_omni_token2wav.model_executor.models.standin.token2wav_dir import ensure_standin_token2wav_dir
from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav import StepAudio2Token2WavCore
from vllm_omni_token2wav.model_executor.models.token2wav_core.synthesis import synthesize_utterance

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

META = torch.device("meta")


@pytest.fixture(autouse=True)
def _single_intra_op_thread() -> Iterator[None]:
    with one_intra_op_thread():
        yield


@pytest.fixture(scope="module")
def core() -> StepAudio2Token2WavCore:
    """A core whose every model lives on the fake device, speaker embedding on the device path."""
    core = StepAudio2Token2WavCore(ensure_standin_token2wav_dir(reduced=True), device=META, prompt_cache_size=0)
    core.enable_device_spk_embedding()
    core.load_models()
    assert core.spk_model.name.startswith("torch-meta") and core.speech_tokenizer.name == "torch"
    return core


@pytest.fixture(scope="module")
def audio() -> Any:
    wav, rate = speech_sample()
    return load_prompt_audio((wav[: 2 * rate], rate))  # the host part: decode, resample, checks


def _prompt(core: StepAudio2Token2WavCore, audio: Any) -> Any:
    return core.speaker_prompt.compute(audio, "digest", core.spk_model, core.speech_tokenizer)


def test_prompt_path_and_stage_launches_never_wait_for_the_device(core: StepAudio2Token2WavCore, audio: Any) -> None:
    _prompt(core, audio)  # first use builds the front end's per-device constants (one copy per process)
    with HostSyncCounter() as syncs:
        features = _prompt(core, audio)
        setup = core.stream_setup(features)
        tokens = torch.tensor([11] * 28).to(META, non_blocking=True)  # a chunk's ids, checked on the host first
        flow_chunks(core.flow, [FlowChunkRow(tokens, setup, False), FlowChunkRow(tokens, setup, False)], pad_frames=6)
        mel = torch.empty(2, 80, 58, device=META)
        noise = DrawnNoise(torch.empty(2, 9, device=META), torch.empty(2, 58 * 480, 9, device=META))
        speech, _ = core.hift(mel, torch.empty(2, 1, 3840, device=META), generator=noise)
    assert syncs.sites == [], syncs.report()
    assert syncs.ops > 2000  # the counter saw the whole path
    assert features.prompt_tokens is not None and features.prompt_mel.shape[1] == 2 * features.prompt_tokens.shape[1]
    assert speech.shape == (2, 58 * 480) and speech.device == META


def test_a_whole_reply_never_waits_for_the_device(core: StepAudio2Token2WavCore, audio: Any) -> None:
    """The stage's whole-reply path (MiniCPM-o's one-chunk stream): ids checked on the host, flow, HiFT."""
    features = _prompt(core, audio)
    with HostSyncCounter() as syncs:
        ids = core.speech_token_ids([11] * 30, "token2wav")  # host list: range-checked, then a non-blocking copy
        speech = synthesize_utterance(core.flow, core.hift, features, ids, n_timesteps=2, generator=None)
    assert syncs.sites == [], syncs.report()
    assert syncs.ops > 500
    assert speech.shape == (1, 30 * 2 * 480) and speech.device == META


def test_a_synchronisation_put_back_into_the_prompt_path_is_caught(
    core: StepAudio2Token2WavCore, audio: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = speaker_embedding_torch.validate_speaker_features

    def validate_and_read_back(feat: object) -> None:  # the phase-1 form: one device read per CAM++ call
        real(feat)
        assert isinstance(feat, torch.Tensor)
        bool(torch.isfinite(feat).all())

    monkeypatch.setattr(speaker_embedding_torch, "validate_speaker_features", validate_and_read_back)
    with HostSyncCounter() as syncs:
        _prompt(core, audio)
    # the innermost project frame is the caller of the (test-defined) check: CAM++'s input preparation
    assert [(s.kind, s.where.split(":")[0], s.where.split(" ")[-1]) for s in syncs.sites] == [
        ("scalar", "model_executor/models/speaker_embedding/torch_backend.py", "(_prepare)")
    ]


def test_the_counter_sees_each_kind_of_synchronisation_and_nothing_else() -> None:
    x = torch.empty(4, device=META)
    with HostSyncCounter() as syncs:
        x.sum().item()
        bool(x.any())
        x.cpu()
        torch.tensor([1, 2], device=META)  # blocking: a pageable copy waits for the stream
        x.tolist()
        x.nonzero()
        torch.tensor([1, 2]).to(META, non_blocking=True)  # not a wait
        torch.ones(3).sum().item()  # a host tensor read on the host: not a wait
    kinds = [s.kind for s in syncs.sites]
    assert kinds == ["scalar", "scalar", "device-to-host", "blocking-host-to-device", "python-read", "dynamic-shape"]
