# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3 flow, several streams per launch (`stream_chunks`): every row as if it ran alone.

Rows differ in prompt length, position, chunk size, deferred or run prompt, final or not. Each row's
mel must equal (a) the same chunk run alone and (b) the independent prefix re-run reference
(`reference.reference_mel`, <= 1e-5), for every chunk. Last chunks are checked in both modes: block-causal
ones run in the launch (reference: the block-causal final run), full-attention ones (the default) re-run
their utterance alone (reference: upstream's last call, `streaming=False`).

(a) is float32 rounding, not bit-identity. A launch performs the same operations as the row alone
except the grouped Conv1d layers (the conv position embedding, one `RaggedConv` over the interleaved
rows, and the pre-lookahead convs), whose float32 kernels see a longer sequence: oneDNN's gemm
convolution (and MKL's im2col GEMM when oneDNN is off) may round an output column differently
depending on the sequence's length and the column's place in it. Every conv output then moves by
about an ulp; through 2 Euler steps x 2 blocks the mel moves by a few ulps of its scale. Bit-identical
on the CPU this was first measured on, and here with oneDNN capped at AVX or SSE4.1; on an AVX2 EPYC
(oneDNN 3.12 `x64:gemm:jit`, torch 2.13, 1 or 2 threads, ATen AVX2 or default kernels, oneDNN on or
off) up to 2.9 eps x the chunk's max|mel| (1.7e-6 at |mel| <= 5.9; 128 chunks of this test's schedule
under 8 seeds) and 2.4 for the deferred prompt (18 prompts), 0 with the convolutions run
length-independently (float64, rounded once). Hence `_solo_bound`: `SOLO_ULPS` float32 eps of the
chunk's largest |mel|. Numbers and commands: docs/design/cosyvoice3.md ("Cross-request batching").
"""

from __future__ import annotations

import random

import pytest
import torch

from tests.model_executor.layers.flow.inputs import make_prompt, make_tokens
from tests.model_executor.layers.flow_cosyvoice3.reference import reference_mel
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import (
    REDUCED_FLOW_CONFIG,
    CausalMaskedDiffWithDiT,
    FinalChunk,
    FlowStreamState,
    noise_table,
    start_stream,
    stream_chunk,
    stream_chunks,
)
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.config import CONV_POS_GROUPS, CONV_POS_KERNEL

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

N_STEPS = 2
#: launch vs solo: at most this many float32 eps of the chunk's largest |mel| (module docstring: measured
#: <= 2.9 on AVX2, 0 where the conv kernels are length-invariant; 8 leaves ~3x for other CPUs' kernels,
#: stays below what the independent reference is held to, 1e-5 ~ 14 eps x 5.9, and fails a batched row
#: off by a relative 1e-6)
SOLO_ULPS = 8
REFERENCE_ATOL = 1e-5


def _solo_bound(mel: torch.Tensor) -> float:
    """How far a row may be from the same row run alone: `SOLO_ULPS` float32 eps of its largest |mel|."""
    return SOLO_ULPS * torch.finfo(torch.float32).eps * float(mel.abs().max())


def _streams(flow: CausalMaskedDiffWithDiT, final_chunk: FinalChunk) -> list[dict]:  # type: ignore[type-arg]
    out = []
    for i, prompt_tokens in enumerate((7, 33, 25, 0)):
        prompt = make_prompt(prompt_tokens, seed=20 + i)
        state = start_stream(
            flow, *prompt, n_timesteps=N_STEPS, noise_seed=i + 1, run_prompt=i % 2 == 0, final_chunk=final_chunk
        )
        out.append({"prompt": prompt, "state": state, "tokens": make_tokens(160, seed=30 + i), "fed": 0, "seed": i + 1})
    return out


@pytest.mark.parametrize("final_chunk", list(FinalChunk))
def test_rows_of_one_launch_equal_each_row_alone_and_the_prefix_rerun(
    cv3_flow: CausalMaskedDiffWithDiT, cv3_weights: dict[str, torch.Tensor], final_chunk: FinalChunk
) -> None:
    streams = _streams(cv3_flow, final_chunk)
    rng = random.Random(0)
    for round_ in range(4):
        final = round_ == 3
        rows = []
        for s in streams:
            hop = rng.choice([2, 11, 28, 53])
            rows.append((s["state"], s["tokens"][:, s["fed"] : s["fed"] + hop], final))
        solo = [stream_chunk(cv3_flow, state, tokens, final=final) for state, tokens, final in rows]
        batched = stream_chunks(cv3_flow, rows)
        for s, (state, tokens, _), (mel_solo, next_solo), (mel, next_state) in zip(
            streams, rows, solo, batched, strict=True
        ):
            assert mel.shape == mel_solo.shape
            if mel.numel():
                diff, bound = (mel - mel_solo).abs().max().item(), _solo_bound(mel_solo)
                assert diff <= bound, f"round {round_}: {diff:.2e} from the row alone, bound {bound:.2e}"
            assert next_state.emitted_frames == next_solo.emitted_frames
            fed = s["fed"] + tokens.size(1)
            if mel.numel():
                pt, pm, spk = s["prompt"]
                ref = reference_mel(
                    cv3_weights,
                    REDUCED_FLOW_CONFIG,
                    prompt_ids=pt,
                    prompt_mel=pm,
                    embedding=spk,
                    ids=s["tokens"][:, :fed],
                    noise=noise_table(s["seed"]),
                    n_timesteps=N_STEPS,
                    streaming=not (final and final_chunk is FinalChunk.FULL_ATTENTION),
                    finalize=final,
                )
                new = ref[:, :, state.emitted_frames - 2 * pt.size(1) if state.emitted_frames else 0 :]
                assert new.shape == mel.shape
                assert (new - mel).abs().max().item() <= REFERENCE_ATOL
            s["state"], s["fed"] = next_state, fed


def test_a_deferred_prompt_gives_the_same_chunks_as_one_run_at_setup(cv3_flow: CausalMaskedDiffWithDiT) -> None:
    prompt, tokens = make_prompt(61, seed=5), make_tokens(90, seed=6)
    out = []
    for run_prompt in (True, False):
        state = start_stream(cv3_flow, *prompt, n_timesteps=N_STEPS, run_prompt=run_prompt)
        assert (state.committed_frames > 0) == run_prompt and (state.unfed_prompt is None) == run_prompt
        mels = []
        for start, end, final in ((0, 30, False), (30, 80, False), (80, 90, True)):
            mel, state = stream_chunk(cv3_flow, state, tokens[:, start:end], final=final)
            mels.append(mel)
        out.append(torch.cat(mels, dim=2))
    assert out[0].shape == out[1].shape == (1, 80, 180)
    diff, bound = (out[0] - out[1]).abs().max().item(), _solo_bound(out[0])
    assert diff <= bound, f"deferred prompt: {diff:.2e} from the prompt run at setup, bound {bound:.2e}"


def test_padding_frames_change_no_row(cv3_flow: CausalMaskedDiffWithDiT) -> None:
    prompts = [make_prompt(9, seed=1), make_prompt(30, seed=2)]
    tokens = [make_tokens(40, seed=3), make_tokens(31, seed=4)]
    states = [start_stream(cv3_flow, *p, n_timesteps=N_STEPS) for p in prompts]
    rows = [(s, t, False) for s, t in zip(states, tokens, strict=True)]
    plain = stream_chunks(cv3_flow, rows)
    padded = stream_chunks(cv3_flow, rows, pad_frames=37)
    for (a, _), (b, _) in zip(plain, padded, strict=True):
        assert a.shape == b.shape and (a - b).abs().max().item() <= _solo_bound(a)


def test_rows_that_cannot_share_a_launch_are_refused_before_anything_runs(cv3_flow: CausalMaskedDiffWithDiT) -> None:
    prompt, tokens = make_prompt(12, seed=1), make_tokens(30, seed=2)
    state = start_stream(cv3_flow, *prompt, n_timesteps=N_STEPS)
    with pytest.raises(ValueError, match="two rows continue the same stream state"):
        stream_chunks(cv3_flow, [(state, tokens, False), (state, tokens, False)])
    other = start_stream(cv3_flow, *prompt, n_timesteps=N_STEPS + 1)
    with pytest.raises(ValueError, match=r"different n_timesteps \[2, 3\]"):
        stream_chunks(cv3_flow, [(state, tokens, False), (other, tokens, False)])
    assert isinstance(state, FlowStreamState) and state.kv.length == state.committed_frames


def test_the_conv_position_embedding_runs_in_calls_of_one_shape_whatever_the_rows(
    cv3_flow: CausalMaskedDiffWithDiT, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why batched == alone holds on every CPU: oneDNN's grouped Conv1d may round with its input length (it does
    on AMD EPYC / AVX2, torch 2.13), so the embedding's convolutions must never see a length that depends on
    the launch. Checked on the calls themselves, so it holds on hosts whose kernels would not show it."""
    seen: list[tuple[tuple[int, ...], bool]] = []
    stock = torch.nn.functional.conv1d

    def spy(x: torch.Tensor, weight: torch.Tensor, *args: object) -> torch.Tensor:
        out = stock(x, weight, *args)
        if len(args) >= 5 and args[4] == CONV_POS_GROUPS:  # (bias, stride, padding, dilation, groups)
            seen.append((tuple(x.shape), x.is_contiguous()))
        return out

    monkeypatch.setattr(torch.nn.functional, "conv1d", spy)
    prompts = [make_prompt(n, seed=40 + n) for n in (0, 9, 30)]
    # block-causal streams: their last chunk runs in a launch too (a full-attention last chunk is a whole-utterance
    # re-run, not a launch)
    states = [
        start_stream(cv3_flow, *p, n_timesteps=N_STEPS, run_prompt=i != 1, final_chunk=FinalChunk.BLOCK_CAUSAL)
        for i, p in enumerate(prompts)
    ]
    rows = [(s, make_tokens(n, seed=n), False) for s, n in zip(states, (4, 31, 53), strict=True)]
    launched = stream_chunks(cv3_flow, rows)
    stream_chunk(cv3_flow, launched[2][1], make_tokens(11, seed=1), final=True)  # a short last piece alone
    dim = REDUCED_FLOW_CONFIG.dim
    want = (2, dim, CONV_POS_KERNEL - 1 + REDUCED_FLOW_CONFIG.static_chunk_size)
    assert seen and {shape for shape, _ in seen} == {want} and all(contiguous for _, contiguous in seen)
