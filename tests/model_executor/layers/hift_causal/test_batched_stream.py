# SPDX-License-Identifier: Apache-2.0
"""Many streams' chunks in one launch (`batched_stream.push_rows`): each row equals its stream pushed alone.

The reference for every row is `CausalHiFTStreamer.push` on that stream alone (itself tested against
the restated reference vocoder in test_stream.py). Streams start at different steps, so stacked rows
sit at different absolute positions (other noise windows, phases, the table wrapping for some rows
and not others); chunks mix lengths, first and last chunks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.helpers.torch_state import one_intra_op_thread
from tests.model_executor.layers.hift_causal.conftest import flow_like_mel
from vllm_omni_token2wav.model_executor.layers.hift_causal import (
    COSYVOICE3_STREAM,
    MINICPMO_1_0_7_STREAM,
    CausalHiFTGenerator,
    CausalHiFTStreamer,
    StreamPolicy,
    TensorNoiseTable,
    load_causal_hift,
)
from vllm_omni_token2wav.model_executor.layers.hift_causal.batched_stream import launch_key, push_rows

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


@pytest.fixture(autouse=True)
def _single_intra_op_thread() -> Iterator[None]:
    with one_intra_op_thread():
        yield


# Per stream: its chunk sizes and the step it joins. Streams 0 and 1 send 50-frame chunks at
# different positions in the same steps (steady state); the others mix first, odd and last chunks.
SCHEDULE = [([50, 50, 50, 17], 0), ([50, 50, 50, 5], 1), ([50, 23], 0), ([13, 31, 7], 0), ([50], 2)]


@pytest.mark.parametrize("policy", [MINICPMO_1_0_7_STREAM, COSYVOICE3_STREAM], ids=lambda p: p.name)
def test_rows_pushed_together_equal_each_stream_alone(model: CausalHiFTGenerator, policy: StreamPolicy) -> None:
    streamer = CausalHiFTStreamer(model, policy)
    schedule = [sizes for sizes, _ in SCHEDULE]
    mels = [flow_like_mel(sum(sizes), seed=40 + i) for i, sizes in enumerate(schedule)]
    solo = []
    for sizes, mel in zip(schedule, mels, strict=True):
        state, start, pieces = streamer.start(), 0, []
        for k, size in enumerate(sizes):
            audio, state = streamer.push(state, mel[..., start : start + size], finalize=k == len(sizes) - 1)
            pieces.append(audio)
            start += size
        solo.append(torch.cat(pieces, dim=-1))

    states = [streamer.start() for _ in schedule]
    sent, offset = [0] * len(schedule), [0] * len(schedule)
    got: list[list[torch.Tensor]] = [[] for _ in schedule]
    launches, shared_positions = 0, set()
    for step in range(6):
        groups: dict[object, list[int]] = {}
        for i, (sizes, join) in enumerate(SCHEDULE):
            if join <= step and sent[i] < len(sizes):
                last = sent[i] == len(sizes) - 1
                groups.setdefault((launch_key(states[i], sizes[sent[i]], last), last), []).append(i)
        for (_, last), members in groups.items():
            before = [(states[i], [t.clone() for t in states[i].tensors()]) for i in members]
            chunks = [mels[i][..., offset[i] : offset[i] + schedule[i][sent[i]]] for i in members]
            outs = push_rows(streamer, [states[i] for i in members], chunks, finalize=last)
            for state, saved in before:  # inputs are never modified
                assert all(torch.equal(a, b) for a, b in zip(state.tensors(), saved, strict=True))
            if len(members) > 1:
                shared_positions.add(tuple(states[i].received for i in members))
            for i, (audio, state) in zip(members, outs, strict=True):
                got[i].append(audio)
                offset[i] += schedule[i][sent[i]]
                sent[i] += 1
                states[i] = state
            launches += 1
    assert sent == [len(sizes) for sizes in schedule]
    assert (100, 50) in shared_positions, "steady-state rows at different positions must share a launch"
    for i, pieces in enumerate(got):
        batched = torch.cat(pieces, dim=-1)
        assert batched.shape == solo[i].shape, i
        torch.testing.assert_close(batched, solo[i], rtol=0, atol=1e-6)
        assert states[i].finalized and states[i].received == sum(schedule[i])


def test_each_row_reads_its_own_noise_window_across_the_table_wrap(reduced_path: Path) -> None:
    table = torch.rand(3000, 9, generator=torch.Generator().manual_seed(4))  # wraps every 6.25 frames
    model = load_causal_hift(reduced_path, device="cpu", noise=TensorNoiseTable(table))
    streamer = CausalHiFTStreamer(model, MINICPMO_1_0_7_STREAM)
    mel_a, mel_b = flow_like_mel(50, seed=5), flow_like_mel(70, seed=6)
    _, state_a = streamer.push(streamer.start(), mel_a[..., :20])
    _, state_b = streamer.push(streamer.start(), mel_b[..., :20])
    _, state_b = streamer.push(state_b, mel_b[..., 20:40])  # b is 20 frames further into the table
    assert launch_key(state_a, 30, False) == launch_key(state_b, 30, False)
    (out_a, _), (out_b, _) = push_rows(streamer, [state_a, state_b], [mel_a[..., 20:50], mel_b[..., 40:70]])
    alone_a, _ = streamer.push(state_a, mel_a[..., 20:50])
    alone_b, _ = streamer.push(state_b, mel_b[..., 40:70])
    torch.testing.assert_close(out_a, alone_a, rtol=0, atol=1e-6)
    torch.testing.assert_close(out_b, alone_b, rtol=0, atol=1e-6)


def test_rows_of_different_geometry_are_refused(model: CausalHiFTGenerator) -> None:
    streamer = CausalHiFTStreamer(model, MINICPMO_1_0_7_STREAM)
    fresh = streamer.start()
    _, started = streamer.push(fresh, flow_like_mel(20, seed=9))
    assert launch_key(fresh, 10, False) != launch_key(started, 10, False)
    with pytest.raises(ValueError, match="2 different geometries; group them by launch_key"):
        push_rows(streamer, [fresh, started], [flow_like_mel(10, seed=1), flow_like_mel(10, seed=2)])
    with pytest.raises(ValueError, match="2 states but 1 mel chunks"):
        push_rows(streamer, [fresh, fresh], [flow_like_mel(10, seed=1)])
    assert push_rows(streamer, [], []) == []
