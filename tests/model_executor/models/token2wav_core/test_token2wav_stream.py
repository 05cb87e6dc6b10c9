# SPDX-License-Identifier: Apache-2.0
"""Streaming rules of the Token2Wav stage: the reference chunking, the cross-fade, PCM conversion."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_omni_token2wav.model_executor.models.token2wav_core.stream import (
    SOURCE_CACHE_SAMPLES,
    crossfade,
    crossfade_window,
    stream_chunks,
    waveform_to_pcm16,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def _reference_feed(tokens: list[int], chunk: int = 25, lookahead: int = 3) -> list[tuple[list[int], bool]]:
    """The reference driver: append tokens one by one, flush chunk + lookahead, keep the lookahead."""
    calls, buffer = [], []
    for token in tokens:
        buffer.append(token)
        if len(buffer) >= chunk + lookahead:
            calls.append((buffer[: chunk + lookahead], False))
            buffer = buffer[chunk:]
    calls.append((buffer, True))
    return calls


@pytest.mark.parametrize("n", [1, 3, 27, 28, 29, 53, 56, 100, 251])
def test_stream_chunks_is_the_reference_feeding_loop(n: int) -> None:
    tokens = list(range(1000, 1000 + n))
    chunks = list(stream_chunks(tokens))
    assert chunks == _reference_feed(tokens)
    emitted = [c if last else c[:-3] for c, last in chunks]
    assert sum(emitted, []) == tokens  # every token is emitted exactly once
    assert all(len(c) == 28 for c, last in chunks if not last) and len(chunks[-1][0]) >= 1


def test_stream_chunks_accepts_arrays_and_rejects_nonsense() -> None:
    assert list(stream_chunks(np.arange(5))) == [([0, 1, 2, 3, 4], True)]
    assert list(stream_chunks(torch.arange(30).reshape(1, 30)))[0] == (list(range(28)), False)
    assert list(stream_chunks([1, 2, 3, 4], chunk_tokens=2, lookahead=0)) == [([1, 2], False), ([3, 4], True)]
    with pytest.raises(ValueError, match="no speech tokens"):
        list(stream_chunks([]))
    with pytest.raises(ValueError, match="chunk_tokens must be >= 2"):
        list(stream_chunks([1, 2, 3], chunk_tokens=1))


def test_crossfade_window_is_numpys_symmetric_hamming_in_float64() -> None:
    window = crossfade_window()
    assert window.dtype == torch.float64 and window.shape == (2 * SOURCE_CACHE_SAMPLES,)
    assert np.array_equal(window.numpy(), np.hamming(2 * SOURCE_CACHE_SAMPLES))


def test_crossfade_blends_only_the_overlap_with_the_cached_tail() -> None:
    gen = torch.Generator().manual_seed(0)
    head = torch.randn(1, 10_000, generator=gen)
    tail = torch.randn(1, 5_000, generator=gen)
    window = crossfade_window()
    out = crossfade(head, tail, window)
    w = np.hamming(7680)
    expected = head[0].numpy().astype(np.float64).copy()
    expected[:3840] = expected[:3840] * w[:3840] + tail[0, -3840:].numpy().astype(np.float64) * w[3840:]
    np.testing.assert_allclose(out[0].numpy(), expected.astype(np.float32), rtol=0, atol=0)
    assert torch.equal(out[:, 3840:], head[:, 3840:]) and out.data_ptr() != head.data_ptr()
    with pytest.raises(ValueError, match="needs 3840 samples on both sides"):
        crossfade(head[:, :100], tail, window)


def test_pcm16_clips_and_scales_like_the_reference() -> None:
    wave = torch.tensor([[0.0, 0.5, -0.5, 1.0, -1.0, 1.7, -3.0]])
    pcm = np.frombuffer(waveform_to_pcm16(wave), dtype="<i2")
    assert pcm.tolist() == [0, 16383, -16383, 32767, -32767, 32767, -32767]
