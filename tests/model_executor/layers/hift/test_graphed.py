# SPDX-License-Identifier: Apache-2.0
"""HiFT replayed from device graphs: noise drawn ahead, the host-check-free iSTFT, and the captured call.

References: `torch.istft` itself (the iSTFT must be bit-identical), per-row draws written out in
the batch-1 order, and the eager `HiFTGenerator` with per-row generators (the captured call must
give its audio bit for bit and leave every generator in the same state). Graphs come from the fake
runtime (`tests/helpers/fake_device_graphs.py`), which fails a capture that synchronises the host.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests.helpers.fake_device_graphs import fake_graph_api
from tests.helpers.torch_state import one_intra_op_thread
from vllm_omni_token2wav.model_executor.layers.hift import HiFTGenerator, load_hift, write_standin_hift
from vllm_omni_token2wav.model_executor.layers.hift.graphed import GraphedHiFT
from vllm_omni_token2wav.model_executor.layers.hift.layers import centred_istft, hann_window
from vllm_omni_token2wav.model_executor.layers.hift.source import DrawnNoise, draw, draw_ahead

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


@pytest.fixture(autouse=True)
def _single_intra_op_thread() -> Iterator[None]:
    with one_intra_op_thread():  # shared 2-core hosts: torch's split loops stall when a core is taken
        yield


@pytest.fixture(scope="module")
def hift(tmp_path_factory: pytest.TempPathFactory) -> HiFTGenerator:
    path = write_standin_hift(tmp_path_factory.mktemp("hift") / "hift.pt", reduced=True, seed=5)
    return load_hift(path, device="cpu")


@pytest.mark.parametrize(("n_fft", "hop", "frames", "batch"), [(16, 4, 30, 2), (16, 4, 6961, 3), (20, 5, 101, 1)])
def test_centred_istft_is_torch_istft_bit_for_bit(n_fft: int, hop: int, frames: int, batch: int) -> None:
    gen = torch.Generator().manual_seed(frames)
    bins = n_fft // 2 + 1
    spec = torch.complex(
        torch.randn(batch, bins, frames, generator=gen), torch.randn(batch, bins, frames, generator=gen)
    )
    window = hann_window(n_fft)
    assert torch.equal(centred_istft(spec, n_fft, hop, window), torch.istft(spec, n_fft, hop, n_fft, window=window))


def test_noise_drawn_ahead_is_each_rows_batch1_draws_and_padding_draws_nothing() -> None:
    gens = [torch.Generator().manual_seed(7), None, torch.Generator().manual_seed(8)]
    noise = draw_ahead(gens, 960, 9, device=torch.device("cpu"), dtype=torch.float32)
    assert noise.initial_phase.shape == (3, 9) and noise.harmonics.shape == (3, 960, 9)
    for row, seed in ((0, 7), (2, 8)):
        ref = torch.Generator().manual_seed(seed)
        assert torch.equal(noise.initial_phase[row], torch.rand(1, 9, generator=ref)[0])
        # The reference's harmonics noise: randn_like of its [1, 960, 9] sines, a transposed [1, 9, 960] tensor.
        assert torch.equal(noise.harmonics[row], torch.empty(1, 9, 960).transpose(1, 2).normal_(generator=ref)[0])
        torch.randn(1, 960, 1, generator=ref)  # the source module's own draw, consumed too
        assert torch.equal(gens[row].get_state(), ref.get_state())  # type: ignore[union-attr]
    assert not noise.initial_phase[1].any() and not noise.harmonics[1].any()
    with pytest.raises(ValueError, match="harmonics is \\[3, 960, 9\\], this call needs \\[3, 480, 9\\]"):
        draw(torch.randn, (3, 480, 9), noise, device=torch.device("cpu"), dtype=torch.float32, role="harmonics")


def test_captured_hift_gives_the_eager_per_row_audio_and_generator_states(hift: HiFTGenerator) -> None:
    api, module = fake_graph_api()
    graphed = GraphedHiFT(hift, device="cpu", graph_api=api)  # capture_after=2: a shape's 2nd call captures
    gen = torch.Generator().manual_seed(0)
    calls = [(3, 50, 0), (3, 58, 3840), (3, 58, 3840), (3, 58, 3840), (3, 44, 3840)]
    for index, (rows, frames, cached) in enumerate(calls):
        mel = torch.randn(rows, 80, frames, generator=gen)
        cache = torch.randn(rows, 1, cached, generator=gen) if cached else None
        mine = [torch.Generator().manual_seed(100 * index + r) for r in range(rows - 1)] + [None]
        theirs = [torch.Generator().manual_seed(100 * index + r) for r in range(rows - 1)] + [None]
        with torch.inference_mode():
            speech, source = graphed(mel, cache, mine)
            want_speech, want_source = hift(mel, cache, generator=theirs)
        assert torch.equal(speech, want_speech) and torch.equal(source, want_source), (rows, frames, cached)
        for a, b in zip(mine[:-1], theirs[:-1], strict=True):
            assert torch.equal(a.get_state(), b.get_state())  # type: ignore[union-attr]
    counters = graphed.counters()
    # (3, 58, 3840) recurs: captured at its 2nd call, replayed at its 3rd; the one-off shapes stay eager.
    assert (counters.captures, counters.replays, counters.failures) == (1, 2, 0)
    assert counters.eager_reasons == {"below_capture_after": 3}
    assert len(module.captures) == 1 and module.replays == 2
    with pytest.raises(ValueError, match="2 generators for a batch of 3 rows"):
        graphed(torch.randn(3, 80, 58), None, [None, None])


def test_noise_drawn_ahead_feeds_the_source_like_the_generators(hift: HiFTGenerator) -> None:
    mel = torch.randn(2, 80, 12, generator=torch.Generator().manual_seed(1))
    gens = [torch.Generator().manual_seed(3), torch.Generator().manual_seed(4)]
    noise = draw_ahead(
        [torch.Generator().manual_seed(3), torch.Generator().manual_seed(4)],
        12 * 480,
        9,
        device=torch.device("cpu"),
        dtype=torch.float32,
    )
    with torch.inference_mode():
        assert torch.equal(hift(mel, generator=noise)[0], hift(mel, generator=gens)[0])
    assert isinstance(noise, DrawnNoise)
