# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3 flow streaming: each chunk equals upstream's prefix re-run, at constant work per chunk.

The reference is `reference.reference_mel`, a plain re-implementation run on every prefix exactly as
upstream's `CosyVoice3Model.tts` calls the flow (`streaming=True, finalize=False`, keep the new
frames; the last call `streaming=False, finalize=True`, full attention); the cached stream, with its
default last chunk (`FinalChunk.FULL_ATTENTION`), must match it within 1e-5 (fp32 CPU) for every chunk.
`FinalChunk.BLOCK_CAUSAL` (opt-in) matches the block-causal final run instead.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.model_executor.layers.flow.inputs import make_prompt, make_tokens
from tests.model_executor.layers.flow_cosyvoice3.reference import reference_mel
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import (
    DEFAULT_FINAL_CHUNK,
    REAL_FLOW_CONFIG,
    REDUCED_FLOW_CONFIG,
    CausalMaskedDiffWithDiT,
    FinalChunk,
    FlowStreamState,
    noise_table,
    plan_chunk,
    start_stream,
    stream_calls,
    stream_chunk,
    upstream_hops,
)

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

ATOL = 1e-5
N_STEPS = 2


def _prefix_rerun(weights, prompt, ids, *, final: bool, streaming: bool | None = None) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The flow over `ids` as upstream's `tts` calls it: block-causal, the last call (`final`) full attention."""
    if streaming is None:
        streaming = not final
    pt, pm, spk = prompt
    return reference_mel(
        weights,
        REDUCED_FLOW_CONFIG,
        prompt_ids=pt,
        prompt_mel=pm,
        embedding=spk,
        ids=ids,
        noise=noise_table(0),
        n_timesteps=N_STEPS,
        streaming=streaming,
        finalize=final,
    )


@pytest.mark.parametrize("prompt_tokens", [0, 7, 25, 33, 61])
def test_every_chunk_equals_the_prefix_rerun_on_upstreams_schedule(
    cv3_flow: CausalMaskedDiffWithDiT, cv3_weights: dict[str, torch.Tensor], prompt_tokens: int
) -> None:
    prompt = make_prompt(prompt_tokens, seed=prompt_tokens)
    tok = make_tokens(190, seed=prompt_tokens + 1)
    state = start_stream(cv3_flow, *prompt, n_timesteps=N_STEPS)
    calls = stream_calls(tok.size(1), prompt_tokens)
    assert [c.end for c in calls][:2] == [25 + (-prompt_tokens) % 25 + 3 + k for k in (0, 50)]
    for call in calls:
        mel, state = stream_chunk(cv3_flow, state, tok[:, call.start : call.end], final=call.final)
        ref = _prefix_rerun(cv3_weights, prompt, tok[:, : call.end], final=call.final)[:, :, 2 * call.offset :]
        assert mel.shape == ref.shape
        torch.testing.assert_close(mel, ref, atol=ATOL, rtol=0, msg=lambda m, c=call: f"chunk ending {c.end}: {m}")
    assert state.finished


@pytest.mark.parametrize("prompt_tokens", [7, 33])
def test_any_hop_sizes_equal_the_prefix_rerun(
    cv3_flow: CausalMaskedDiffWithDiT, cv3_weights: dict[str, torch.Tensor], prompt_tokens: int
) -> None:
    """Hops that leave a 50-frame chunk incomplete: its frames are emitted now and recomputed next call."""
    prompt = make_prompt(prompt_tokens, seed=5)
    tok = make_tokens(110, seed=6)
    state = start_stream(cv3_flow, *prompt, n_timesteps=N_STEPS)
    fed = emitted = 0
    for end, final in [(2, False), (5, False), (17, False), (18, False), (44, False), (81, False), (110, True)]:
        mel, state = stream_chunk(cv3_flow, state, tok[:, fed:end], final=final)
        fed = end
        if end > 3 or final:
            ref = _prefix_rerun(cv3_weights, prompt, tok[:, :end], final=final)[:, :, emitted:]
            torch.testing.assert_close(mel, ref, atol=ATOL, rtol=0)
        else:
            assert mel.shape == (1, 80, 0)
        emitted += mel.size(2)
    assert emitted == 2 * 110


def test_the_default_final_chunk_is_upstreams_full_attention(cv3_flow: CausalMaskedDiffWithDiT) -> None:
    assert DEFAULT_FINAL_CHUNK is FinalChunk.FULL_ATTENTION
    state = start_stream(cv3_flow, *make_prompt(5, seed=1), n_timesteps=1)
    assert state.final_chunk is FinalChunk.FULL_ATTENTION and state.replay is not None


def test_full_attention_final_chunk_reproduces_upstreams_last_call(
    cv3_flow: CausalMaskedDiffWithDiT, cv3_weights: dict[str, torch.Tensor]
) -> None:
    """Upstream's last call re-runs everything with full attention (`finalize=True, streaming=False`)."""
    prompt = make_prompt(13, seed=9)
    tok = make_tokens(96, seed=10)
    calls = stream_calls(tok.size(1), 13)
    results = {}
    for mode in FinalChunk:
        state = start_stream(cv3_flow, *prompt, n_timesteps=N_STEPS, final_chunk=mode)
        for call in calls:
            mel, state = stream_chunk(cv3_flow, state, tok[:, call.start : call.end], final=call.final)
        results[mode] = mel
    last = calls[-1]
    full = _prefix_rerun(cv3_weights, prompt, tok, final=True, streaming=False)[:, :, 2 * last.offset :]
    block = _prefix_rerun(cv3_weights, prompt, tok, final=True, streaming=True)[:, :, 2 * last.offset :]
    torch.testing.assert_close(results[FinalChunk.FULL_ATTENTION], full, atol=ATOL, rtol=0)
    torch.testing.assert_close(results[FinalChunk.BLOCK_CAUSAL], block, atol=ATOL, rtol=0)
    assert (full - block).abs().max() > 1e-4, "the two final-chunk rules are different computations"


def test_interleaved_requests_are_independent(cv3_flow: CausalMaskedDiffWithDiT) -> None:
    prompts = [make_prompt(9, seed=1), make_prompt(40, seed=2)]
    toks = [make_tokens(200, seed=3), make_tokens(90, seed=4)]
    schedules = [stream_calls(t.size(1), p[0].size(1)) for t, p in zip(toks, prompts, strict=True)]

    def solo(i: int) -> list[torch.Tensor]:
        state, out = start_stream(cv3_flow, *prompts[i], n_timesteps=N_STEPS, noise_seed=i), []
        for call in schedules[i]:
            mel, state = stream_chunk(cv3_flow, state, toks[i][:, call.start : call.end], final=call.final)
            out.append(mel)
        return out

    alone = [solo(0), solo(1)]
    states = [start_stream(cv3_flow, *prompts[i], n_timesteps=N_STEPS, noise_seed=i) for i in (0, 1)]
    mixed: list[list[torch.Tensor]] = [[], []]
    order = [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2), (0, 3)]  # (request, call index)
    for i, k in order:
        call = schedules[i][k]
        mel, states[i] = stream_chunk(cv3_flow, states[i], toks[i][:, call.start : call.end], final=call.final)
        mixed[i].append(mel)
    assert len(schedules[0]) == 4 and len(schedules[1]) == 3
    for i in (0, 1):
        assert all(torch.equal(a, b) for a, b in zip(alone[i], mixed[i], strict=True))


@pytest.mark.parametrize("final_chunk", list(FinalChunk))
def test_a_failed_chunk_leaves_the_state_usable_and_an_old_state_can_be_continued(
    cv3_flow: CausalMaskedDiffWithDiT, final_chunk: FinalChunk
) -> None:
    prompt = make_prompt(20, seed=11)
    tok = make_tokens(60, seed=12)
    state = start_stream(cv3_flow, *prompt, n_timesteps=N_STEPS, final_chunk=final_chunk)
    first, after_first = stream_chunk(cv3_flow, state, tok[:, :33])
    bad = tok[:, 33:40].clone()
    bad[0, 3] = 6561
    with pytest.raises(ValueError, match=r"allowed \[0, 6561\)"):
        stream_chunk(cv3_flow, after_first, bad)
    second, done = stream_chunk(cv3_flow, after_first, tok[:, 33:], final=True)
    # a retry from the same (older) state gives the same frames (block-causal: via the arena's copy-on-write path)
    again, _ = stream_chunk(cv3_flow, after_first, tok[:, 33:], final=True)
    assert torch.equal(second, again)
    assert done.finished and not after_first.finished
    with pytest.raises(ValueError, match="already had its final chunk"):
        stream_chunk(cv3_flow, done, tok[:, :1])
    with pytest.raises(dataclasses.FrozenInstanceError):
        after_first.known_tokens = 0  # type: ignore[misc]


def test_bad_stream_input_is_an_error_naming_the_problem(cv3_flow: CausalMaskedDiffWithDiT) -> None:
    pt, pm, spk = make_prompt(12)
    with pytest.raises(ValueError, match=r"ids span \[-1, \d+\], allowed \[0, 6561\)"):
        start_stream(cv3_flow, torch.cat([pt, torch.tensor([[-1]])], 1), torch.cat([pm, pm[:, :2]], 1), spk)
    with pytest.raises(ValueError, match="prompt_mel has 20 frames but 12 prompt tokens need 24"):
        start_stream(cv3_flow, pt, pm[:, :20], spk)
    with pytest.raises(ValueError, match=r"26 mel frames .* noise table holds 20"):
        start_stream(cv3_flow, pt, pm, spk, noise=noise_table(0)[:, :, :20])
    with pytest.raises(TypeError, match="FlowStreamState"):
        stream_chunk(cv3_flow, {"not": "a state"}, pt)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_timesteps must be >= 1"):
        start_stream(cv3_flow, pt, pm, spk, n_timesteps=0)
    with pytest.raises(ValueError, match="never received a generated token"):
        stream_chunk(cv3_flow, start_stream(cv3_flow, pt, pm, spk, n_timesteps=1), pt[:, :0], final=True)
    state = start_stream(cv3_flow, pt, pm, spk, n_timesteps=1, noise=noise_table(0)[:, :, :60])
    with pytest.raises(ValueError, match=r"64 mel frames .* noise table holds 60"):
        stream_chunk(cv3_flow, state, make_tokens(23))


# ---------------------------------------------------------------- the plan: constant work, caches sized to need


def test_upstream_hops_align_the_first_chunk_to_the_mask_then_double_to_100() -> None:
    for prompt_tokens, first in [(0, 25), (7, 43), (25, 25), (33, 42), (61, 39)]:
        hops = upstream_hops(prompt_tokens)
        assert [next(hops) for _ in range(5)] == [first, 50, 100, 100, 100]
        assert (prompt_tokens + first) % 25 == 0
    calls = stream_calls(20, 7)
    assert len(calls) == 1 and calls[0].final and (calls[0].start, calls[0].end) == (0, 20)


def test_on_upstreams_schedule_each_chunk_computes_only_its_own_frames() -> None:
    """Work per chunk is independent of the history: computed frames = emitted frames = 2 x hop."""
    for prompt_tokens in (0, 7, 33, 250):
        committed = emitted = known = 0
        plans = []
        calls = stream_calls(2000, prompt_tokens)
        first = plan_chunk(
            REAL_FLOW_CONFIG,
            known_tokens=0,
            new_tokens=prompt_tokens,
            prompt_tokens=prompt_tokens,
            committed=0,
            emitted=0,
            final=False,
        )
        committed, emitted, known = first.commit_end, first.emit_end, first.known_tokens
        for call in calls[:-1]:
            plan = plan_chunk(
                REAL_FLOW_CONFIG,
                known_tokens=known,
                new_tokens=call.end - call.start,
                prompt_tokens=prompt_tokens,
                committed=committed,
                emitted=emitted,
                final=False,
            )
            plans.append(plan)
            committed, emitted, known = plan.commit_end, plan.emit_end, plan.known_tokens
        hops = [c.end - c.start for c in calls[:-1]]
        assert [p.frames for p in plans][2:] == [200] * (len(plans) - 2)
        for plan, call in zip(plans, calls, strict=False):
            assert plan.compute_start % 50 == 0 and plan.commit_end == plan.compute_end == plan.emit_end
            assert plan.emit_start == plan.compute_start or call is calls[0]
        assert hops[2:] == [100] * (len(hops) - 2)


def test_cache_memory_is_sized_to_the_frames_and_grows_geometrically(cv3_flow: CausalMaskedDiffWithDiT) -> None:
    pt, pm, spk = make_prompt(10)
    tok = make_tokens(400)
    # block-causal: the last chunk writes the arena too (a full-attention last chunk re-runs without it)
    state = start_stream(cv3_flow, pt, pm, spk, n_timesteps=1, final_chunk=FinalChunk.BLOCK_CAUSAL)
    arenas, capacities = set(), []
    for call in stream_calls(tok.size(1), 10):
        _, state = stream_chunk(cv3_flow, state, tok[:, call.start : call.end], final=call.final)
        arenas.add(id(state.kv))
        capacities.append(state.kv.capacity)
    frames = 2 * (10 + 400)
    assert capacities[-1] == frames, "the final chunk sizes the arena exactly"
    assert all(b >= a for a, b in zip(capacities, capacities[1:], strict=False))
    assert len(arenas) <= 5, "growth doubles, so few reallocations"
    c = REDUCED_FLOW_CONFIG
    per_frame = 2 * 2 * c.depth * c.heads * c.dim_head * 4  # k + v, CFG rows, blocks, fp32, 1 step
    assert state.kv.nbytes == frames * per_frame
    assert isinstance(state, FlowStreamState) and state.cache_bytes >= state.kv.nbytes


def test_a_float16_flow_streams_float32_mel_close_to_the_float32_flow(cv3_flow_files) -> None:  # type: ignore[no-untyped-def]
    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import load_flow

    half = load_flow(cv3_flow_files[0].parent, device="cpu", float16=True)
    full = load_flow(cv3_flow_files[0].parent, device="cpu")
    prompt, tok = make_prompt(30, seed=21), make_tokens(80, seed=22)
    outputs = []
    for model in (half, full):
        state, mels = start_stream(model, *prompt, n_timesteps=N_STEPS), []
        for call in stream_calls(tok.size(1), 30):
            mel, state = stream_chunk(model, state, tok[:, call.start : call.end], final=call.final)
            mels.append(mel)
        outputs.append(torch.cat(mels, dim=2))
    assert outputs[0].dtype == torch.float32 and outputs[0].shape == outputs[1].shape == (1, 80, 160)
    assert torch.isfinite(outputs[0]).all()
    assert ((outputs[0] - outputs[1]).norm() / outputs[1].norm()).item() < 0.02
