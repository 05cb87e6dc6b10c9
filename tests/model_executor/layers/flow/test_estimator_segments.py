# SPDX-License-Identifier: Apache-2.0
"""The batched estimator run segment by segment from device graphs gives the eager launch bit for bit.

Graphs come from the fake runtime (`tests/helpers/fake_device_graphs.py`: replays recorded aten
ops, fails a capture that synchronises the host). The reference is `inference_chunk` of each
stream alone (itself pinned to the upstream semantics in test_streaming.py), as in test_batched.py.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.fake_device_graphs import fake_graph_api
from tests.model_executor.layers.flow.test_batched import N_STEPS, _streams
from vllm_omni_token2wav.model_executor.layers.flow import CausalMaskedDiffWithXvec
from vllm_omni_token2wav.model_executor.layers.flow.batched import FlowChunkRow, flow_chunks
from vllm_omni_token2wav.model_executor.layers.flow.estimator_segments import EstimatorGraphs

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def test_replayed_segments_give_each_stream_its_solo_chunk(
    reduced_flow: CausalMaskedDiffWithXvec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_STAGE_FRAME_BUCKETS", "16:512")
    api, module = fake_graph_api()
    graphs = EstimatorGraphs(reduced_flow.decoder.estimator, context_rows=6, device="cpu", graph_api=api)
    streams = _streams(reduced_flow)
    gen = torch.Generator().manual_seed(4)
    # Launch frames (with padding to a 16-multiple): 4 x 50 + 8 = 208, 50 + 28 + 50 + 12 + 4 = 144, 208 again.
    plan = [[28, 28, 28, 28], [28, 17, 28, 9], [28, 28, 28, 28]]
    sizes = []
    for lengths in plan:
        rows, refs = [], []
        for i, n in enumerate(lengths):
            tokens = torch.randint(0, 6561, (n,), generator=gen)
            s = streams[i]
            mel, s["ref"] = reduced_flow.inference_chunk(tokens[None], s["spk"], s["ref"], False, N_STEPS)  # type: ignore[arg-type]
            rows.append(FlowChunkRow(tokens, s["state"], False))  # type: ignore[arg-type]
            refs.append(mel)
        frames = sum(2 * (n - 3) for n in lengths)
        pad = -frames % 16
        sizes.append(frames + pad)
        outs = flow_chunks(reduced_flow, rows, pad_frames=pad, graphs=graphs)
        for i, (out, mel) in enumerate(zip(outs, refs, strict=True)):
            assert torch.equal(out.mel, mel), (lengths, i)  # conv plan padded to 6 rows, replayed: still exact
            streams[i]["state"] = out.state
    assert sizes == [208, 144, 208]
    for counters in graphs.counters():  # every segment: one graph per launch size, one replay per launch and step
        assert (counters.captures, counters.replays, counters.failures) == (2, 3 * N_STEPS, 0), counters.summary()
    assert len(module.captures) == 2 * len(graphs.runners) and graphs.eager_launches == 0


def test_launches_a_graph_cannot_serve_run_eagerly_and_are_counted(
    reduced_flow: CausalMaskedDiffWithXvec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_STAGE_FRAME_BUCKETS", "64,128")
    api, module = fake_graph_api()
    graphs = EstimatorGraphs(reduced_flow.decoder.estimator, context_rows=2, device="cpu", graph_api=api)
    assert graphs.use_for(2, 128) and not graphs.use_for(3, 128) and not graphs.use_for(2, 100)
    streams = _streams(reduced_flow)
    rows = [FlowChunkRow(torch.full((28,), 7), s["state"], False) for s in streams[:3]]  # type: ignore[arg-type]
    eager = flow_chunks(reduced_flow, rows)
    outs = flow_chunks(reduced_flow, rows, pad_frames=0, graphs=graphs)  # 3 rows > 2, 150 frames: no bucket
    assert all(torch.equal(a.mel, b.mel) for a, b in zip(outs, eager, strict=True))
    assert graphs.eager_launches == 3 and not module.captures  # the two probes above and this launch
