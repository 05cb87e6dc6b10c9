# SPDX-License-Identifier: Apache-2.0
"""speaker_features: the CAM++ input, checked against kaldi-native-fbank minus its time mean."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.model_executor.models.audio.conftest import knf_fbank
from vllm_omni_token2wav.model_executor.models.audio import MIN_SPEAKER_FRAMES, min_speaker_samples
from vllm_omni_token2wav.model_executor.models.speaker_embedding.features import speaker_features

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def _reference(samples: np.ndarray) -> np.ndarray:
    feats = knf_fbank(samples)  # 80 bins, dither 0, 16 kHz, Kaldi defaults: the upstream front end
    return feats - feats.mean(axis=0, keepdims=True)


def test_speaker_features_equal_cmn_kaldi_fbank_of_real_speech(speech_16k: np.ndarray) -> None:
    ours = speaker_features(torch.from_numpy(speech_16k))
    assert isinstance(ours, torch.Tensor) and ours.shape == (398, 80) and ours.dtype == torch.float32
    diff = np.abs(ours.numpy() - _reference(speech_16k))
    assert diff.max() <= 1e-3 and diff.mean() <= 1e-5


def test_batched_speaker_features_use_each_items_own_mean(speech_16k: np.ndarray) -> None:
    items = [speech_16k, speech_16k[5000:20000] * 0.3, np.random.default_rng(0).normal(0, 0.05, 3000)]
    lengths = [len(x) for x in items]
    batch = torch.zeros(3, max(lengths))
    for i, x in enumerate(items):
        batch[i, : len(x)] = torch.from_numpy(np.asarray(x, dtype=np.float32))
    feats, counts = speaker_features(batch, lengths=lengths)
    for i, x in enumerate(items):
        ref = _reference(np.asarray(x, dtype=np.float32))
        assert int(counts[i]) == ref.shape[0]
        np.testing.assert_allclose(feats[i, : ref.shape[0]].numpy(), ref, atol=1e-3, rtol=0)
        assert not feats[i, ref.shape[0] :].any()


def test_minimum_length_is_four_frames() -> None:
    need = min_speaker_samples()
    assert need == 400 + (MIN_SPEAKER_FRAMES - 1) * 160
    noise = torch.from_numpy(np.random.default_rng(1).normal(0, 0.1, need).astype(np.float32))
    assert speaker_features(noise).shape == (MIN_SPEAKER_FRAMES, 80)
    with pytest.raises(ValueError, match=r"879 samples .* needs >= 4"):
        speaker_features(noise[: need - 1])
    with pytest.raises(ValueError, match=r"item 1 has 879 samples .* give 3 fbank frame"):
        speaker_features(torch.stack([noise, noise]), lengths=[need, need - 1])


def test_speaker_features_reject_nan() -> None:
    wav = torch.zeros(16000)
    wav[100] = float("nan")
    with pytest.raises(ValueError, match="NaN/Inf"):
        speaker_features(wav)
