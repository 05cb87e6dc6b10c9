# SPDX-License-Identifier: Apache-2.0
"""The batched vocoder step: rows of one HiFT launch equal their own batch-1 vocoder steps."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.torch_state import one_intra_op_thread
from vllm_omni.model_executor.models.cosyvoice2.hift import HiFTGenerator, load_hift
from vllm_omni.model_executor.models.step_audio2.token2wav_stream import crossfade, crossfade_rows, crossfade_window
from vllm_omni.model_executor.models.step_audio2.token2wav_vocoder import (
    NoiseState,
    VocoderRow,
    VocoderState,
    vocode_chunks,
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


def test_rows_with_different_mel_lengths_cannot_share_a_launch(hift: HiFTGenerator) -> None:
    state = VocoderState.start(80, torch.device("cpu"), NoiseState(0))
    rows = [VocoderRow(torch.zeros(1, 80, n), state, False) for n in (50, 48)]
    with pytest.raises(ValueError, match="must share mel length and caches"):
        vocode_chunks(hift, rows, crossfade_window())


def test_row_crossfade_is_the_single_row_crossfade_per_row() -> None:
    gen = torch.Generator().manual_seed(1)
    head, tail = torch.randn(3, 9000, generator=gen), torch.randn(3, 3840, generator=gen)
    window = crossfade_window()
    out = crossfade_rows(head, tail, window)
    for i in range(3):
        assert torch.equal(out[i : i + 1], crossfade(head[i : i + 1], tail[i : i + 1], window))
    with pytest.raises(ValueError, match="3 rows of new audio but 2 cached tails"):
        crossfade_rows(head, tail[:2], window)
