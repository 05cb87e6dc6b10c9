# SPDX-License-Identifier: Apache-2.0
"""The batched vocoder step: rows of one HiFT launch equal their own batch-1 vocoder steps."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.torch_state import one_intra_op_thread
from vllm_omni_token2wav.model_executor.layers.hift import HiFTGenerator, load_hift
from vllm_omni_token2wav.model_executor.layers.hift.batched import (
    NoiseState,
    VocoderRow,
    VocoderState,
    vocode_chunks,
)
from vllm_omni_token2wav.model_executor.models.token2wav_core.stream import (
    crossfade,
    crossfade_rows,
    crossfade_window,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


@pytest.fixture(autouse=True)
def _single_intra_op_thread() -> Iterator[None]:
    with one_intra_op_thread():
        yield


@pytest.fixture(scope="module")
def hift(token2wav_dir: Path) -> HiFTGenerator:
    return load_hift(token2wav_dir / "hift.pt", device="cpu")


def _reference_step(hift: HiFTGenerator, row: VocoderRow, window: np.ndarray) -> tuple[np.ndarray, VocoderState]:
    """One request's vocoder step written out: cached mel + chunk, cached source, float64 Hamming fade."""
    gen = row.state.noise.generator(torch.device("cpu"))
    mel = torch.cat([row.state.mel, row.mel], dim=2)
    with torch.inference_mode():
        speech_t, source = hift(mel, row.state.source if row.state.source.shape[2] else None, generator=gen)
    speech = speech_t[0].numpy().astype(np.float64)
    held = row.state.speech[0].numpy().astype(np.float64)
    if held.size:
        speech[:3840] = speech[:3840] * window[:3840] + held * window[3840:]
    speech = speech.astype(np.float32)
    state = VocoderState(
        mel[..., -8:], source[..., -3840:], torch.from_numpy(speech[-3840:]).reshape(1, -1), row.state.noise.after(gen)
    )
    return (speech if row.last else speech[:-3840]), state


def test_rows_of_one_launch_equal_their_own_steps_over_a_stream(hift: HiFTGenerator) -> None:
    window = np.hamming(7680)
    gen = torch.Generator().manual_seed(0)
    states = [VocoderState.start(80, torch.device("cpu"), NoiseState(seed)) for seed in (1, 2, 3)]
    refs = list(states)
    for step, frames in enumerate((50, 50, 12)):
        rows = [VocoderRow(torch.randn(1, 80, frames, generator=gen), s, step == 2) for s in states]
        out = vocode_chunks(hift, rows, crossfade_window(), pad_rows=1 if step == 1 else 0)
        for i, (row, got) in enumerate(zip(rows, out, strict=True)):
            expected, refs[i] = _reference_step(hift, VocoderRow(row.mel, refs[i], row.last), window)
            assert got.speech.shape == (1, expected.shape[0])
            np.testing.assert_allclose(got.speech[0].numpy(), expected, rtol=0, atol=1e-6)
            assert torch.equal(got.state.noise.state, refs[i].noise.state)  # type: ignore[arg-type]
        states = [o.state for o in out]
    assert [s.mel.shape[2] for s in states] == [8, 8, 8]


def test_rows_of_different_lengths_and_caches_share_one_launch_and_equal_their_own_steps(hift: HiFTGenerator) -> None:
    """First chunks (no caches), steady chunks (8 cached frames) and last chunks of several lengths in
    one padded, masked launch: each row is its own batch-1 vocoder step (1e-6, the 1e-5 stage budget
    with margin), and draws exactly its own noise."""
    window = np.hamming(7680)
    gen = torch.Generator().manual_seed(2)
    device = torch.device("cpu")
    fresh = [VocoderState.start(80, device, NoiseState(seed)) for seed in (11, 12, 13, 14, 15)]
    # Give rows 1..4 a first chunk of their own so they carry mel / source / speech caches.
    warm = vocode_chunks(
        hift, [VocoderRow(torch.randn(1, 80, 50, generator=gen), s, False) for s in fresh[1:]], crossfade_window()
    )
    states = [fresh[0], *(w.state for w in warm)]
    frames, last = (50, 50, 3, 17, 41), (False, False, True, True, True)
    rows = [
        VocoderRow(torch.randn(1, 80, n, generator=gen), s, end) for n, s, end in zip(frames, states, last, strict=True)
    ]
    assert len({row.state.launch_key(row.mel.shape[2]) for row in rows}) == 5  # five different shapes
    out = vocode_chunks(hift, rows, crossfade_window(), pad_rows=2)
    for row, got in zip(rows, out, strict=True):
        expected, state = _reference_step(hift, row, window)
        assert got.speech.shape == (1, expected.shape[0])
        np.testing.assert_allclose(got.speech[0].numpy(), expected, rtol=0, atol=1e-6)
        torch.testing.assert_close(got.state.source, state.source, rtol=0, atol=1e-6)
        assert torch.equal(got.state.mel, state.mel)
        assert torch.equal(got.state.noise.state, state.noise.state)  # type: ignore[arg-type]


def test_padded_rows_equal_unpadded_rows_at_every_length(hift: HiFTGenerator) -> None:
    """The masks at each up-sampling stage: a row right-padded by any amount decodes to its own speech."""
    gen = torch.Generator().manual_seed(3)
    mels = [torch.randn(1, 80, n, generator=gen) for n in (1, 2, 5, 9, 24)]
    with torch.inference_mode():
        speech, sources = hift.vocode_rows(mels, [None] * 5, [torch.Generator().manual_seed(i) for i in range(5)])
        for i, mel in enumerate(mels):
            alone, source = hift(mel, generator=torch.Generator().manual_seed(i))
            assert torch.equal(sources[i], source)  # the source is computed per row: bit-equal
            n = alone.shape[1]
            torch.testing.assert_close(speech[i, :n], alone[0], rtol=0, atol=1e-6)
            assert not speech[i, n:].any()
    with pytest.raises(ValueError, match="one of each per row"):
        hift.vocode_rows(mels, [None], [None])


def test_row_crossfade_is_the_single_row_crossfade_per_row() -> None:
    gen = torch.Generator().manual_seed(1)
    head, tail = torch.randn(3, 9000, generator=gen), torch.randn(3, 3840, generator=gen)
    window = crossfade_window()
    out = crossfade_rows(head, tail, window)
    for i in range(3):
        assert torch.equal(out[i : i + 1], crossfade(head[i : i + 1], tail[i : i + 1], window))
    with pytest.raises(ValueError, match="3 rows of new audio but 2 cached tails"):
        crossfade_rows(head, tail[:2], window)
