# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3 prompt features: the 12 kHz-band mel, truncating 2:1 alignment, the talker's payload, bad input.

The mel is checked against the audio tests' independent float64 reference (librosa's Slaney filters +
numpy STFT) with fmax 12 kHz; alignment against the rule written out here (n = min(frames // 2,
tokens), never padding).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.model_executor.models.audio.test_mel import MAX_ABS_LIMIT, _reference_mel
from vllm_omni_token2wav.model_executor.models.audio import PROMPT_MEL_CONFIG, log_mel_spectrogram
from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_token2wav import CosyVoice3Token2Wav
from vllm_omni_token2wav.model_executor.models.cosyvoice3.prompt import (
    COSYVOICE3_MEL_CONFIG,
    MAX_PROMPT_TOKENS,
    build_prompt,
    prompt_from_conditioning,
    read_prompt_tokens,
    token_ids,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.usefixtures("cpu_platform")]

CPU = torch.device("cpu")


def _tone(freq: float, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(seconds * 24000)) / 24000
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def test_cosyvoice3_mel_reaches_12_khz_and_matches_the_reference() -> None:
    tone = _tone(10_000.0)  # above Step-Audio2's 8 kHz band, inside CosyVoice3's
    ours = log_mel_spectrogram(torch.from_numpy(tone), COSYVOICE3_MEL_CONFIG)
    ref = _reference_mel(tone, COSYVOICE3_MEL_CONFIG)
    assert COSYVOICE3_MEL_CONFIG.fmax == 12000.0 and ours.shape == (1, 50, 80)
    assert np.abs(ours[0].numpy() - ref).max() <= MAX_ABS_LIMIT
    narrow = log_mel_spectrogram(torch.from_numpy(tone), PROMPT_MEL_CONFIG)
    assert ours[0, 10].max() > -1.0 > narrow[0, 10].max()  # the tone is in the top bins only with fmax 12 kHz


@pytest.mark.parametrize(("tokens", "frames", "kept"), [(30, 64, 30), (30, 57, 28), (40, 80, 40), (1, 3, 1)])
def test_alignment_truncates_tokens_and_frames_to_the_shorter(tokens: int, frames: int, kept: int) -> None:
    ids = torch.arange(tokens)
    mel = torch.randn(1, frames, 80)
    prompt = build_prompt(ids, mel, torch.randn(1, 192), key="k", device=CPU, where="test")
    assert prompt.tokens.tolist() == [list(range(kept))]
    assert torch.equal(prompt.mel, mel[:, : 2 * kept])


def test_the_talkers_payload_is_unpadded_with_its_length_and_aligned() -> None:
    ids = torch.tensor([[5, 6, 7, 8, 0, 0]])
    feat = torch.randn(1, 12, 80)
    emb = torch.randn(1, 192)
    prompt = prompt_from_conditioning([ids], [feat], [emb], [torch.tensor([4])], device=CPU)
    assert prompt.tokens.tolist() == [[5, 6, 7, 8]] and torch.equal(prompt.mel, feat[:, :8])
    again = prompt_from_conditioning(ids[:, :4], feat[:, :8], emb, device=CPU)
    assert again.key == prompt.key and again.key.startswith("talker:")
    changed = prompt_from_conditioning(ids[:, :4], feat[:, :8], emb + 1e-3, device=CPU)
    assert changed.key != prompt.key


@pytest.mark.parametrize(
    ("tokens", "mel", "emb", "match"),
    [
        ([1, 6561], (1, 4, 80), (1, 192), r"speech token id 6561 is outside \[0, 6561\)"),
        ([-1, 2], (1, 4, 80), (1, 192), "speech token id -1"),
        ([], (1, 4, 80), (1, 192), "no speech tokens"),
        (
            [1] * (MAX_PROMPT_TOKENS + 1),
            (1, 1600, 80),
            (1, 192),
            r"751 tokens \(30.0 s\) but a prompt holds at most 750",
        ),
        ([1, 2], (1, 4, 81), (1, 192), r"expected \(1, frames, 80\)"),
        ([1, 2], (1, 4, 80), (1, 64), r"expected \(1, 192\)"),
        ([1, 2], (1, 1, 80), (1, 192), "fewer than 2 per token"),
    ],
)
def test_bad_prompts_are_errors_naming_the_problem(
    tokens: list[int], mel: tuple[int, ...], emb: tuple[int, ...], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        build_prompt(tokens, torch.zeros(mel), torch.zeros(emb), key="k", device=CPU, where="test")


def test_token_files_and_token_values_are_checked(tmp_path: Path) -> None:
    good = tmp_path / "voice.tokens"
    good.write_text("1 2,3\n4\n")
    assert read_prompt_tokens(good).tolist() == [[1, 2, 3, 4]]
    bad = tmp_path / "bad.tokens"
    bad.write_text("1 x 3")
    with pytest.raises(ValueError, match=r"'x' is not a speech token id"):
        read_prompt_tokens(bad)
    with pytest.raises(FileNotFoundError, match="missing.tokens"):
        read_prompt_tokens(tmp_path / "missing.tokens")
    with pytest.raises(ValueError, match="integer speech token ids"):
        token_ids(torch.tensor([1.0, 2.0]), "tokens")


def test_facade_prompt_uses_the_speaker_path_and_the_12_khz_mel_once_per_clip(cv3_dir: Path) -> None:
    from vllm_omni_token2wav.assets.audio import speech_sample
    from vllm_omni_token2wav.model_executor.models import audio as frontend

    core = CosyVoice3Token2Wav(cv3_dir, device="cpu")
    wav, rate = speech_sample()
    clip = (wav[: 2 * rate].copy(), rate)
    prompt = core.prompt(clip, list(range(60)))
    at_24k = frontend.load_audio(clip, 24000).numpy()
    ref = _reference_mel(at_24k, COSYVOICE3_MEL_CONFIG)
    assert prompt.num_tokens == 50 and prompt.mel.shape == (1, 100, 80)  # 2 s of mel = 50 tokens of the 60
    assert np.abs(prompt.mel[0].numpy() - ref[:100]).max() <= MAX_ABS_LIMIT
    assert torch.equal(prompt.embedding, core.speaker_embedding(clip))
    misses = core.prompt_cache_stats.misses
    other_tokens = core.prompt(clip, list(range(100, 160)))
    assert core.prompt_cache_stats.misses == misses  # same audio: embedding and mel from the cache
    assert other_tokens.key != prompt.key and torch.equal(other_tokens.mel, prompt.mel)
