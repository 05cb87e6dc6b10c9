# SPDX-License-Identifier: Apache-2.0
"""Bounded streaming of the causal HiFT: chunked == whole, emission schedule, state handling, bad input."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tests.helpers.mark import hardware_test
from tests.model_executor.layers.hift_causal.conftest import NOISE, flow_like_mel
from tests.model_executor.layers.hift_causal.reference import reference_inference, reference_noise
from vllm_omni_token2wav.model_executor.layers.hift_causal import (
    COSYVOICE3_STREAM,
    MINICPMO_1_0_7_STREAM,
    REDUCED_CAUSAL_HIFT_CONFIG,
    CausalHiFTGenerator,
    CausalHiFTStreamer,
    CausalHiFTStreamState,
    NoiseOrigin,
    StreamPolicy,
    TensorNoiseTable,
    load_causal_hift,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

LOW_LATENCY = dataclasses.replace(COSYVOICE3_STREAM, name="low-latency", emit_lag_frames=5)


def run_stream(
    streamer: CausalHiFTStreamer, mel: torch.Tensor, sizes: list[int], *, final_empty: bool = False
) -> tuple[list[torch.Tensor], CausalHiFTStreamState]:
    """Push `mel` in chunks of `sizes` (cycled); the last chunk (or an extra empty one) finalizes."""
    state = streamer.start(mel.shape[0])
    outputs, start, i = [], 0, 0
    total = mel.shape[-1]
    while start < total:
        size = min(sizes[i % len(sizes)], total - start)
        last = start + size == total and not final_empty
        audio, state = streamer.push(state, mel[..., start : start + size], finalize=last)
        outputs.append(audio)
        start, i = start + size, i + 1
    if final_empty:
        audio, state = streamer.push(state, mel[..., :0], finalize=True)
        outputs.append(audio)
    return outputs, state


CHUNKINGS = {
    "one push": [10_000],
    "frame by frame": [1],
    "uneven": [7, 16, 33, 1, 50, 21],
    "with empty pushes": [3, 0, 9, 0, 5],
    "cosyvoice3 hops": [50, 100, 200],
}


@pytest.mark.parametrize("frames", [1, 5, 9, 23, 64, 131])
@pytest.mark.parametrize("chunking", sorted(CHUNKINGS))
def test_streamed_audio_equals_the_whole_utterance(model: CausalHiFTGenerator, frames: int, chunking: str) -> None:
    mel = flow_like_mel(frames, seed=100 + frames)
    streamer = CausalHiFTStreamer(model, COSYVOICE3_STREAM)
    outputs, state = run_stream(streamer, mel, CHUNKINGS[chunking], final_empty=chunking == "with empty pushes")
    streamed = torch.cat(outputs, dim=-1)
    whole = reference_inference(model, mel, reference_noise(NOISE.seed, NOISE.draws_before, frames * 480))
    assert streamed.shape == whole.shape == (1, 480 * frames)
    torch.testing.assert_close(streamed, whole, rtol=0, atol=1e-6)
    assert state.finalized and state.emitted == frames


@pytest.mark.parametrize("policy", [COSYVOICE3_STREAM, LOW_LATENCY, MINICPMO_1_0_7_STREAM], ids=lambda p: p.name)
def test_each_non_final_chunk_emits_up_to_the_policy_lag(model: CausalHiFTGenerator, policy: StreamPolicy) -> None:
    mel = flow_like_mel(90, seed=7)
    streamer = CausalHiFTStreamer(model, policy)
    state = streamer.start()
    received, total = 0, 0
    for size in (3, 6, 20, 1, 30):
        audio, state = streamer.push(state, mel[..., received : received + size])
        received += size
        frames = max(0, received - policy.emit_lag_frames)
        silence = policy.leading_silence_samples if frames else 0
        total += audio.shape[-1]
        assert total == 480 * frames + silence, (received, total)
    audio, state = streamer.push(state, mel[..., received:], finalize=True)
    total += audio.shape[-1]
    assert total == 480 * 90 + policy.leading_silence_samples


@pytest.mark.parametrize("chunking", ["uneven", "frame by frame"])
def test_minicpmo_policy_is_chunking_invariant_and_leads_with_3840_zeros(
    model: CausalHiFTGenerator, chunking: str
) -> None:
    mel = flow_like_mel(70, seed=8)
    streamer = CausalHiFTStreamer(model, MINICPMO_1_0_7_STREAM)
    whole, _ = run_stream(streamer, mel, [10_000])
    chunks, _ = run_stream(streamer, mel, CHUNKINGS[chunking])
    streamed = torch.cat(chunks, dim=-1)
    # One call that is also the last chunk: no zeros (minicpmo-utils adds them only to a non-final call).
    assert whole[0].shape == (1, 480 * 70)
    first = next(c for c in chunks if c.shape[-1])
    assert torch.equal(first[:, :3840], torch.zeros(1, 3840)) and first[:, 3840:].abs().max() > 0
    torch.testing.assert_close(streamed[:, 3840:], whole[0], rtol=0, atol=1e-6)


def test_empty_non_final_pushes_return_no_audio_under_every_policy(model: CausalHiFTGenerator) -> None:
    for policy in (COSYVOICE3_STREAM, MINICPMO_1_0_7_STREAM):
        streamer = CausalHiFTStreamer(model, policy)
        audio, state = streamer.push(streamer.start(), torch.zeros(1, 80, 0))
        assert audio.shape == (1, 0) and state.received == 0 and not state.finalized
        _, state = streamer.push(state, flow_like_mel(20, seed=18))
        audio, later = streamer.push(state, torch.zeros(1, 80, 0))
        assert audio.shape == (1, 0) and later.emitted == state.emitted == 12
        assert later.emitted_samples == 12 * 480


def test_minicpmo_zeros_are_skipped_when_the_first_audio_comes_with_the_last_chunk(model: CausalHiFTGenerator) -> None:
    streamer = CausalHiFTStreamer(model, MINICPMO_1_0_7_STREAM)
    mel = flow_like_mel(12, seed=9)
    quiet, state = streamer.push(streamer.start(), mel[..., :6])  # 6 frames < the 8-frame delay: no audio yet
    assert quiet.shape == (1, 0) and state.silence_pending
    audio, state = streamer.push(state, mel[..., 6:], finalize=True)
    assert audio.shape == (1, 480 * 12) and not state.silence_pending


def test_interleaved_requests_are_independent(model: CausalHiFTGenerator) -> None:
    streamer = CausalHiFTStreamer(model, COSYVOICE3_STREAM)
    mels = [flow_like_mel(60, seed=s) for s in (11, 12)]
    alone = [torch.cat(run_stream(streamer, mel, [13])[0], dim=-1) for mel in mels]
    states = [streamer.start(), streamer.start()]
    outputs: list[list[torch.Tensor]] = [[], []]
    for start in range(0, 60, 13):
        for r in (1, 0):  # alternate the order too
            end = min(start + 13, 60)
            audio, states[r] = streamer.push(states[r], mels[r][..., start:end], finalize=end == 60)
            outputs[r].append(audio)
    for r in range(2):
        torch.testing.assert_close(torch.cat(outputs[r], dim=-1), alone[r], rtol=0, atol=0)
    # Two rows in one state advance together and equal the two single-row streams.
    both = torch.cat(run_stream(streamer, torch.cat(mels), [13])[0], dim=-1)
    torch.testing.assert_close(both, torch.cat(alone), rtol=0, atol=1e-6)


def test_push_never_mutates_the_state_it_is_given(model: CausalHiFTGenerator) -> None:
    streamer = CausalHiFTStreamer(model, COSYVOICE3_STREAM)
    mel = flow_like_mel(40, seed=13)
    _, state = streamer.push(streamer.start(), mel[..., :15])
    snapshot = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
    tensors = {k: v.clone() for k, v in state.contexts.items()}
    a, _ = streamer.push(state, mel[..., 15:], finalize=True)
    with pytest.raises(ValueError, match="80"):
        streamer.push(state, torch.zeros(1, 79, 4))  # a failed push ...
    b, _ = streamer.push(state, mel[..., 15:], finalize=True)  # ... leaves the state usable
    assert torch.equal(a, b)
    for name, value in snapshot.items():
        assert getattr(state, name) is value, name
    for key, value in tensors.items():
        assert torch.equal(state.contexts[key], value), key
    with pytest.raises(TypeError):
        state.contexts["conv_post"] = torch.zeros(1)  # type: ignore[index]


def test_state_size_does_not_grow_with_the_utterance(model: CausalHiFTGenerator) -> None:
    """What a chunk computes on is its own frames plus the state; the state stays the same size."""
    streamer = CausalHiFTStreamer(model, COSYVOICE3_STREAM)
    mel = flow_like_mel(25 * 40, seed=14)
    state = streamer.start()
    sizes = []
    for k in range(40):
        _, state = streamer.push(state, mel[..., 25 * k : 25 * (k + 1)])
        tensors = [state.mel_tail, state.phase, state.source_tail, state.post, *state.contexts.values()]
        sizes.append(sum(t.numel() for t in tensors))
    assert len(set(sizes[2:])) == 1, sizes
    assert state.mel_tail.shape[-1] == 4 and state.source_tail.shape[-1] < 480 + 16


def test_noise_wraps_at_the_table_end_the_same_way_whole_and_streamed(reduced_path: Path) -> None:
    table = reference_noise(NOISE.seed, 0, 2000)
    model = load_causal_hift(reduced_path, device="cpu", noise=TensorNoiseTable(table))
    mel = flow_like_mel(12, seed=15)  # 5760 samples: the 2000-sample table wraps twice
    streamed = torch.cat(run_stream(CausalHiFTStreamer(model), mel, [5])[0], dim=-1)
    wrapped = table[:, torch.arange(12 * 480) % 2000]
    torch.testing.assert_close(streamed, reference_inference(model, mel, wrapped), rtol=0, atol=1e-6)


def test_bad_input_is_rejected_with_the_cause(model: CausalHiFTGenerator, reduced_path: Path) -> None:
    streamer = CausalHiFTStreamer(model, COSYVOICE3_STREAM)
    state = streamer.start()
    with pytest.raises(ValueError, match=r"mel \[B, 80, T\].*transposed"):
        streamer.push(state, torch.zeros(1, 12, 80))
    with pytest.raises(ValueError, match=r"mel \[B, 80, T\]"):
        streamer.push(state, torch.zeros(80, 12))
    with pytest.raises(ValueError, match="floating-point"):
        streamer.push(state, torch.zeros(1, 80, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="2 rows but the stream state has 1"):
        streamer.push(state, torch.zeros(2, 80, 4))
    with pytest.raises(ValueError, match="0 frames"):
        model.inference(torch.zeros(1, 80, 0))
    with pytest.raises(ValueError, match="CausalHiFTStreamState"):
        streamer.push({"mel": torch.zeros(1)}, torch.zeros(1, 80, 4))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch >= 1"):
        streamer.start(0)
    with pytest.raises(ValueError, match=r"emit_lag_frames 4 < 5"):
        CausalHiFTStreamer(model, dataclasses.replace(COSYVOICE3_STREAM, emit_lag_frames=4))
    with pytest.raises(ValueError, match="block_frames"):
        dataclasses.replace(COSYVOICE3_STREAM, block_frames=0)

    # A state only continues where it was made: same policy, config, noise table and devices.
    minicpmo = CausalHiFTStreamer(model, MINICPMO_1_0_7_STREAM)
    with pytest.raises(ValueError, match=r"another vocoder setup \(policy: "):
        minicpmo.push(state, torch.zeros(1, 80, 4))
    other_noise = load_causal_hift(reduced_path, device="cpu", noise=NoiseOrigin(seed=6))
    with pytest.raises(ValueError, match=r"noise: .*seed 5.* vs streamer .*seed 6"):
        CausalHiFTStreamer(other_noise).push(state, torch.zeros(1, 80, 4))
    wider = CausalHiFTGenerator(dataclasses.replace(REDUCED_CAUSAL_HIFT_CONFIG, base_channels=64), noise=model.noise)
    with pytest.raises(ValueError, match=r"config: "):
        CausalHiFTStreamer(wider).push(state, torch.zeros(1, 80, 4))

    # A finalized stream takes no more frames (an empty final push is a no-op).
    _, done = streamer.push(state, flow_like_mel(10, seed=16), finalize=True)
    empty, same = streamer.push(done, torch.zeros(1, 80, 0), finalize=True)
    assert empty.shape == (1, 0) and same is done
    with pytest.raises(ValueError, match="finalized; start"):
        streamer.push(done, torch.zeros(1, 80, 3))
    with pytest.raises(ValueError, match="finalized; start"):
        streamer.push(done, torch.zeros(1, 80, 0))


@hardware_test(res={"cuda": "H100", "npu": "A2"}, num_cards=1)
def test_device_stream_matches_the_cpu_whole_utterance(reduced_path: Path, model: CausalHiFTGenerator) -> None:
    """Decoder on the accelerator (F0 in float64 there on CUDA, on the CPU on NPU); CPU twin: the tests above."""
    device_model = load_causal_hift(reduced_path, noise=NOISE)  # the serving device
    assert device_model.device.type != "cpu"
    assert device_model.f0_predictor.classifier.weight.dtype == torch.float64
    mel = flow_like_mel(90, seed=17)
    with torch.inference_mode():
        expected = model.inference(mel)
        chunks, _ = run_stream(CausalHiFTStreamer(device_model), mel.to(device_model.device), [7, 16, 33])
    streamed = torch.cat(chunks, dim=-1).cpu()
    assert streamed.shape == expected.shape
    torch.testing.assert_close(streamed, expected, rtol=1e-3, atol=1e-4)
