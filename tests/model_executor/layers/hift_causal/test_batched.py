# SPDX-License-Identifier: Apache-2.0
"""Causal HiFT, rows of several requests in one push (`hift.batched`): stack, push, split.

Rows at equal stream positions share a push; each row's audio must equal its own push alone within
1e-5 (measured ~2e-6 on the reduced stand-in: the decoder's float32 convolutions round differently
at batch > 1; F0 and the sine source are float64 / elementwise and stay exact), every row's
state must continue exactly like its solo state, and rows at different positions are refused.
"""

from __future__ import annotations

import pytest
import torch

from tests.model_executor.layers.hift_causal.conftest import NOISE, flow_like_mel
from tests.model_executor.layers.hift_causal.reference import reference_inference, reference_noise
from vllm_omni_token2wav.model_executor.layers.hift_causal import (
    COSYVOICE3_STREAM,
    CausalHiFTGenerator,
    CausalHiFTStreamer,
)
from vllm_omni_token2wav.model_executor.layers.hift_causal.batched import (
    push_key,
    push_rows,
    split_state,
    stack_states,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

TOLERANCE = 1e-5
CHUNKS = ((56, False), (100, False), (44, False), (30, True))


def test_stacked_pushes_equal_each_request_alone_and_the_reference(model: CausalHiFTGenerator) -> None:
    streamer = CausalHiFTStreamer(model, COSYVOICE3_STREAM)
    mels = [flow_like_mel(230, seed=i) * (1.0 + 0.5 * i) for i in range(3)]
    solo = [streamer.start() for _ in mels]
    stacked = list(solo)
    heard: list[list[torch.Tensor]] = [[] for _ in mels]
    start = 0
    for frames, last in CHUNKS:
        parts = [m[..., start : start + frames] for m in mels]
        alone = [streamer.push(s, p, finalize=last) for s, p in zip(solo, parts, strict=True)]
        together = push_rows(streamer, stacked, parts, finalize=last)
        for i, ((a, s), (b, t)) in enumerate(zip(alone, together, strict=True)):
            assert a.shape == b.shape
            assert (a - b).abs().max().item() <= TOLERANCE
            assert push_key(s, 0, False) == push_key(t, 0, False) and torch.equal(s.phase, t.phase)
            heard[i].append(b)
        solo, stacked = [s for _, s in alone], [t for _, t in together]
        start += frames
    for i, mel in enumerate(mels):
        noise = reference_noise(NOISE.seed, NOISE.draws_before, mel.shape[-1] * 480)
        reference = reference_inference(model, mel, noise)
        audio = torch.cat(heard[i], dim=-1)
        assert audio.shape == reference.shape and (audio - reference).abs().max().item() <= TOLERANCE


def test_split_undoes_stack_and_positions_must_match(model: CausalHiFTGenerator) -> None:
    streamer = CausalHiFTStreamer(model, COSYVOICE3_STREAM)
    a, b = streamer.start(), streamer.start()
    _, a = streamer.push(a, flow_like_mel(40, seed=1))
    _, b = streamer.push(b, flow_like_mel(40, seed=2))
    both = stack_states([a, b])
    assert both.batch == 2
    back = split_state(both, [1, 1])
    for original, copy in zip((a, b), back, strict=True):
        assert torch.equal(original.post, copy.post) and torch.equal(original.phase, copy.phase)
        assert set(original.contexts) == set(copy.contexts)
        assert all(torch.equal(original.contexts[k], copy.contexts[k]) for k in original.contexts)
    _, later = streamer.push(a, flow_like_mel(10, seed=3))
    with pytest.raises(ValueError, match="different positions"):
        stack_states([later, b])
    with pytest.raises(ValueError, match="one mel per state with equal frame counts"):
        push_rows(streamer, [a, b], [flow_like_mel(3, seed=4), flow_like_mel(4, seed=5)], finalize=False)
    with pytest.raises(ValueError, match="sum to the state's 2 rows"):
        split_state(both, [1])
