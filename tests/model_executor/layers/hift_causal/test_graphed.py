# SPDX-License-Identifier: Apache-2.0
"""The causal HiFT's streaming push with its decoder replayed from device graphs equals the eager push bit for bit.

Graphs come from the fake runtime (`tests/helpers/fake_device_graphs.py`). The same mel, chunk by chunk
(first chunk, steady chunks of one length that recur, a last chunk), goes through the eager streamer and
the graphed one (`GraphedCausalHiFT.streamer()`); every chunk's audio, every state (phase, contexts,
tails) and the whole utterance must be identical, and the whole utterance also equals the model's own
`inference` on the concatenated mel (itself pinned to the reference in test_causal_hift.py).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.fake_device_graphs import fake_graph_api
from tests.model_executor.layers.hift_causal.conftest import flow_like_mel
from vllm_omni_token2wav.model_executor.layers.hift_causal import (
    COSYVOICE3_STREAM,
    CausalHiFTGenerator,
    CausalHiFTStreamer,
)
from vllm_omni_token2wav.model_executor.layers.hift_causal.batched import push_rows
from vllm_omni_token2wav.model_executor.layers.hift_causal.graphed import GraphedCausalHiFT, decoder_carry_keys

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

# a first chunk, four steady 12-frame chunks (the steady decode shape recurs: captured at its 2nd call), the last
CHUNKS = ((16, False), (12, False), (12, False), (12, False), (12, False), (10, True))


def test_replayed_decoder_gives_every_chunk_and_the_whole_utterance_of_the_eager_push(
    model: CausalHiFTGenerator,
) -> None:
    api, module = fake_graph_api()
    graphed = GraphedCausalHiFT(model, device="cpu", graph_api=api)
    assert graphed.active and graphed.keys and not any(k.startswith("f0_predictor") for k in graphed.keys)
    eager, replayed = CausalHiFTStreamer(model, COSYVOICE3_STREAM), graphed.streamer(COSYVOICE3_STREAM)
    assert replayed.layout == eager.layout  # states are interchangeable
    mels = torch.cat([flow_like_mel(sum(f for f, _ in CHUNKS), seed=i) for i in range(2)])  # two rows
    state_e, state_g = eager.start(2), replayed.start(2)
    heard_e, heard_g = [], []
    start = 0
    for frames, last in CHUNKS:
        part = mels[..., start : start + frames]
        audio_e, state_e = eager.push(state_e, part, finalize=last)
        audio_g, state_g = replayed.push(state_g, part, finalize=last)
        assert torch.equal(audio_g, audio_e), (start, (audio_g - audio_e).abs().max().item())
        assert torch.equal(state_g.phase, state_e.phase) and torch.equal(state_g.post, state_e.post)
        assert torch.equal(state_g.source_tail, state_e.source_tail)
        assert set(state_g.contexts) == set(state_e.contexts)
        assert all(torch.equal(state_g.contexts[k], state_e.contexts[k]) for k in state_e.contexts), start
        heard_e.append(audio_e)
        heard_g.append(audio_g)
        start += frames
    whole = torch.cat(heard_g, dim=-1)
    assert torch.equal(whole, torch.cat(heard_e, dim=-1))
    assert torch.equal(whole, model.inference(mels, finalize=True))
    counters = graphed.counters()
    # steady decodes: chunks 2..5 (the first decode is the stream's first; the last is final): one shape,
    # eager at its first call (capture_after=2), captured at the second, replayed from then on
    assert (counters.captures, counters.replays, counters.failures) == (1, 3, 0), counters.summary()
    assert len(module.captures) == 1 and graphed.eager_decodes == 2


def test_graphed_streamer_serves_stacked_pushes_and_keys_cover_the_decoder(model: CausalHiFTGenerator) -> None:
    api, _ = fake_graph_api()
    graphed = GraphedCausalHiFT(model, device="cpu", graph_api=api, capture_after=1)
    eager, replayed = CausalHiFTStreamer(model), graphed.streamer()
    mels = [flow_like_mel(40, seed=10 + i) for i in range(3)]
    states_e = [eager.start() for _ in mels]
    states_g = [replayed.start() for _ in mels]
    for start, frames, last in ((0, 16, False), (16, 12, False), (28, 12, True)):
        parts = [m[..., start : start + frames] for m in mels]
        out_e = push_rows(eager, states_e, parts, finalize=last)
        out_g = push_rows(replayed, states_g, parts, finalize=last)
        assert all(torch.equal(a, b) for (a, _), (b, _) in zip(out_e, out_g, strict=True))
        states_e, states_g = [s for _, s in out_e], [s for _, s in out_g]
    assert graphed.counters().replays == 1
    # the carried contexts a steady decode reads are exactly the decoder's convs
    assert set(decoder_carry_keys(model)) == {k for k in states_e[0].contexts if not k.startswith("f0_predictor")}


def test_switched_off_runs_the_eager_decode_and_captures_nothing(model: CausalHiFTGenerator) -> None:
    api, module = fake_graph_api()
    graphed = GraphedCausalHiFT(model, device="cpu", graph_api=api, enabled=False)
    streamer = graphed.streamer()
    state = streamer.start()
    for frames in (16, 12, 12, 12):
        _, state = streamer.push(state, flow_like_mel(frames, seed=frames))
    assert not graphed.active and not module.captures and graphed.eager_decodes == 4
