# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3's flow launches with the DiT segments replayed from device graphs give the eager launch bit for bit.

Graphs come from the fake runtime (`tests/helpers/fake_device_graphs.py`: a replay re-runs the recorded
aten ops on the captured tensors, a capture that synchronises the host fails). Two copies of the same
streams (same prompts, noise seeds, token chunks) run side by side: one through the plain eager launch
(`stream_chunks`), one with `forward=FlowGraphs.forward_frames`, with the same padding. Every chunk's
mel, every committed K/V frame and conv history, and the whole utterance (all chunks concatenated) must
be identical: the segments are the eager block's ops in the same order on the same shapes, and the
attention (eager on both sides) reads the same arena. The eager side is itself pinned to the independent
prefix re-run in test_batched.py.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.fake_device_graphs import fake_graph_api
from tests.model_executor.layers.flow.inputs import make_prompt, make_tokens
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import (
    CausalMaskedDiffWithDiT,
    FinalChunk,
    FlowStreamState,
    plan_chunk,
    start_stream,
    stream_chunks,
)
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.graphed import DiTSegments, FlowGraphs, run_segments

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

N_STEPS = 2
BUCKET = 16


def _states(flow: CausalMaskedDiffWithDiT) -> list[FlowStreamState]:
    return [
        start_stream(
            flow,
            *make_prompt(n, seed=50 + i),
            n_timesteps=N_STEPS,
            noise_seed=i + 3,
            run_prompt=i == 1,
            final_chunk=FinalChunk.BLOCK_CAUSAL,
        )
        for i, n in enumerate((7, 33, 0))
    ]


def test_replayed_segments_give_every_chunk_and_the_whole_utterance_of_the_eager_launch(
    cv3_flow: CausalMaskedDiffWithDiT, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_STAGE_FRAME_BUCKETS", f"{BUCKET}:1024")
    api, module = fake_graph_api()
    graphs = FlowGraphs(cv3_flow.estimator, device="cpu", graph_api=api)
    assert graphs.active and len(graphs.runners) == cv3_flow.config.depth + 2
    eager_states, graph_states = _states(cv3_flow), _states(cv3_flow)
    tokens = [make_tokens(120, seed=60 + i) for i in range(3)]
    fed = [0, 0, 0]
    eager_mel: list[list[torch.Tensor]] = [[], [], []]
    graph_mel: list[list[torch.Tensor]] = [[], [], []]
    # chunk hops (the first ones as upstream's 25 + pad), then the same hops again (the same launch sizes
    # recur), then a last chunk of the rest
    schedule = [[28, 30, 25], [25, 25, 25], [28, 30, 25], [25, 25, 25], None]
    pads = []
    for hops in schedule:
        final = hops is None
        new = [120 - f for f in fed] if hops is None else hops
        chunks = [t[:, f : f + n] for t, f, n in zip(tokens, fed, new, strict=True)]
        # the padding that rounds the launch's computed frames up to a bucket, as the stage's planner does
        frames = _computed_frames(cv3_flow, graph_states, chunks, final)
        pad = -frames % BUCKET
        pads.append(frames + pad)
        eager = stream_chunks(
            cv3_flow, [(s, c, final) for s, c in zip(eager_states, chunks, strict=True)], pad_frames=pad
        )
        assert graphs.use_for(frames + pad)
        replayed = stream_chunks(
            cv3_flow,
            [(s, c, final) for s, c in zip(graph_states, chunks, strict=True)],
            pad_frames=pad,
            forward=graphs.forward_frames,
        )
        for i, ((mel_e, next_e), (mel_g, next_g)) in enumerate(zip(eager, replayed, strict=True)):
            assert torch.equal(mel_g, mel_e), (hops, i, (mel_g - mel_e).abs().max().item())
            assert next_g.committed_frames == next_e.committed_frames
            committed = next_e.committed_frames
            ke, ve = next_e.kv.read(N_STEPS - 1, cv3_flow.config.depth - 1, committed)
            kg, vg = next_g.kv.read(N_STEPS - 1, cv3_flow.config.depth - 1, committed)
            assert torch.equal(kg, ke) and torch.equal(vg, ve), (hops, i)
            if next_e.conv_history is not None:
                assert torch.equal(next_g.conv_history, next_e.conv_history), (hops, i)  # type: ignore[arg-type]
            eager_mel[i].append(mel_e)
            graph_mel[i].append(mel_g)
            eager_states[i], graph_states[i] = next_e, next_g
        fed = [f + n for f, n in zip(fed, new, strict=True)]
    for i in range(3):  # the whole utterance, chunk by chunk
        whole_e, whole_g = torch.cat(eager_mel[i], dim=2), torch.cat(graph_mel[i], dim=2)
        assert whole_g.shape[-1] == 2 * (120 + (7, 33, 0)[i]) - 2 * (7, 33, 0)[i]
        assert torch.equal(whole_g, whole_e), i
    keys = len(set(pads))
    assert keys < len(pads)  # some launch sizes recurred: replays without a capture
    for counters in graphs.counters():  # every segment: one graph per launch size, one replay per launch and step
        assert (counters.captures, counters.replays, counters.failures) == (keys, len(pads) * N_STEPS, 0), (
            counters.summary()
        )
    assert len(module.captures) == keys * len(graphs.runners)
    assert graphs.eager_launches == 0


def _computed_frames(
    flow: CausalMaskedDiffWithDiT, states: list[FlowStreamState], chunks: list[torch.Tensor], final: bool
) -> int:
    """The frames the launch of these rows computes (`plan_chunk` per row, as the stage's `shape`)."""
    total = 0
    for s, c in zip(states, chunks, strict=True):
        unfed = 0 if s.unfed_prompt is None else s.unfed_prompt.shape[1]
        plan = plan_chunk(
            flow.config,
            known_tokens=s.known_tokens,
            new_tokens=unfed + c.shape[1],
            prompt_tokens=s.prompt_tokens,
            committed=s.committed_frames,
            emitted=s.emitted_frames,
            final=final,
        )
        total += plan.frames
    return total


def test_eager_segments_are_the_estimator_forward_frames(cv3_flow: CausalMaskedDiffWithDiT) -> None:
    """The cut itself (no graphs): the segment functions compute `DiT.forward_frames` bit for bit."""
    est = cv3_flow.estimator
    g = torch.Generator().manual_seed(0)
    n, dim = 37, est.config.dim
    x, mu, cond, spk = (torch.randn(2, 80, n, generator=g) for _ in range(4))
    t = torch.rand(2, generator=g)
    positions = torch.arange(11, 11 + n)
    conv = est.input_embed.conv_pos_embed

    def pos_embed(h: torch.Tensor) -> torch.Tensor:
        return conv(h)[0]

    def attend(block: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    want = est.forward_frames(x, mu, t, spk, cond, positions=positions, pos_embed=pos_embed, attend=attend)
    segments = DiTSegments(est)
    got = run_segments(
        segments.functions(), x, mu, t, spk, cond, positions=positions, pos_embed=pos_embed, attend=attend
    )
    assert segments.count == est.config.depth + 2 and want.shape == (2, 80, n) and dim > 0
    assert torch.equal(got, want)


def test_launch_sizes_that_are_no_bucket_run_eagerly_and_are_counted(
    cv3_flow: CausalMaskedDiffWithDiT, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_STAGE_FRAME_BUCKETS", "64,128")
    api, module = fake_graph_api()
    graphs = FlowGraphs(cv3_flow.estimator, device="cpu", graph_api=api)
    assert graphs.use_for(64) and graphs.use_for(128) and not graphs.use_for(100) and not graphs.use_for(16)
    assert (graphs.graph_launches, graphs.eager_launches) == (2, 2) and not module.captures


def test_inactive_graphs_capture_nothing(cv3_flow: CausalMaskedDiffWithDiT) -> None:
    api, module = fake_graph_api()
    graphs = FlowGraphs(cv3_flow.estimator, device="cpu", graph_api=api, enabled=False)
    assert not graphs.active and not graphs.use_for(64) and not module.captures
