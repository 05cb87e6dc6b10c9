# SPDX-License-Identifier: Apache-2.0
"""Batched streaming chunks of the flow model against the batch-1 reference path (`inference_chunk`).

The reference for every row is `CausalMaskedDiffWithXvec.inference_chunk` on that stream alone
(itself tested against the upstream semantics in test_streaming.py). Rows mix prompt lengths,
conformer trimming, first/middle/last chunks and chunk lengths; on CPU the batched result is
expected to be bit-identical (see `batched.py` for why the conformer runs per row).
"""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from vllm_omni_token2wav.model_executor.layers.flow import CausalMaskedDiffWithXvec, ConformerTrim, Lookahead
from vllm_omni_token2wav.model_executor.layers.flow.batched import (
    FlowChunkRow,
    FlowRowState,
    check_chunk,
    flow_chunks,
    project_speaker,
)
from vllm_omni_token2wav.model_executor.layers.flow.kv_cache import EstimatorKV, plan_trim
from vllm_omni_token2wav.model_executor.layers.flow.ragged import RaggedConv, RaggedLayout
from vllm_omni_token2wav.model_executor.layers.flow.streaming import trim_time

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

N_STEPS = 2


@pytest.mark.parametrize(("kernel", "context", "keep"), [(3, 2, 2), (4, 0, 0), (5, 4, 4), (3, 2, 0)])
def test_ragged_conv_equals_each_rows_own_convolution(kernel: int, context: int, keep: int) -> None:
    gen = torch.Generator().manual_seed(kernel)
    conv = nn.Conv1d(8, 6, kernel)
    lengths = (7, 12, 5 + kernel, 30)
    layout = RaggedLayout(lengths, pad=3)
    x = torch.randn(2, 8, layout.total, generator=gen)
    ctx = torch.randn(2, 8, len(lengths) * context, generator=gen)
    out, new_ctx = RaggedConv(layout, kernel, context, torch.device("cpu"), keep_context=keep)(
        conv, x, ctx if context else None
    )
    start = 0
    for i, n in enumerate(lengths):
        row = x[:, :, layout.offsets[i] : layout.offsets[i] + n]
        full = torch.cat([ctx[:, :, i * context : (i + 1) * context], row], dim=2)
        expected = conv(full)
        torch.testing.assert_close(out[:, :, start : start + expected.shape[2]], expected, rtol=1e-6, atol=1e-6)
        start += expected.shape[2]
        if keep:
            assert torch.equal(new_ctx[:, :, i * keep : (i + 1) * keep], full[:, :, -keep:])  # type: ignore[index]
    assert new_ctx is None if not keep else new_ctx.shape == (2, 8, len(lengths) * keep)


@pytest.mark.parametrize("pad", [0, 3])
def test_fixed_context_rows_keep_every_rows_result_and_shapes_depend_only_on_total(pad: int) -> None:
    """`context_rows=R`: same selected outputs and contexts as the exact plan; index shapes fixed by (total, R)."""
    gen = torch.Generator().manual_seed(pad)
    conv = nn.Conv1d(8, 6, 3)
    shapes = set()
    for lengths in [(9, 12, 5), (26,), (4, 4, 4, 4, 10)]:
        layout = RaggedLayout(lengths, pad=pad)
        rows, capacity = len(lengths), 6
        x = torch.randn(2, 8, layout.total, generator=gen)
        ctx = torch.randn(2, 8, rows * 2, generator=gen)
        exact = RaggedConv(layout, 3, 2, torch.device("cpu"), keep_context=2)
        fixed = RaggedConv(layout, 3, 2, torch.device("cpu"), keep_context=2, context_rows=capacity)
        padded_ctx = torch.cat([ctx, torch.randn(2, 8, (capacity - rows) * 2, generator=gen)], dim=2)
        out, new_ctx = exact(conv, x, ctx)
        out_f, new_ctx_f = fixed(conv, x, padded_ctx)
        assert torch.equal(out_f, out) and torch.equal(new_ctx_f[:, :, : rows * 2], new_ctx)  # type: ignore[index]
        shapes.add(tuple(t.shape for t in fixed.indices.tensors()))
    assert len(shapes) == 1  # 26 + pad frames in 1, 3 or 5 rows: one set of index shapes
    with pytest.raises(ValueError, match="context_rows 2 is fewer than the layout's 3 rows"):
        RaggedConv(RaggedLayout((3, 3, 3)), 3, 2, torch.device("cpu"), context_rows=2)


def test_ragged_conv_rejects_rows_shorter_than_its_kernel() -> None:
    with pytest.raises(ValueError, match="row 1 has 2 frames \\+ 0 context, fewer than the kernel's 4"):
        RaggedConv(RaggedLayout((6, 2)), 4, 0, torch.device("cpu"))


def test_trim_plan_equals_the_reference_trim_on_the_materialised_cache() -> None:
    """Every (new, own, base, base_from, P) combination: the split representation trims like `trim_time`."""
    rng = random.Random(0)
    for _ in range(400):
        base_len = rng.randrange(1, 160)
        base_from = rng.randrange(0, base_len + 1)
        new, own, prompt, tail = rng.randrange(1, 60), rng.randrange(0, 200), rng.randrange(1, 130), 100
        full = torch.arange(new + own + base_len - base_from).reshape(1, 1, 1, 1, -1, 1)
        expected = trim_time(full, 4, prompt, tail).reshape(-1)
        plan = plan_trim(new, own, base_len, base_from, prompt, tail)
        got = [i for lo, hi in plan.own_ranges for i in range(lo, hi)]
        got += list(range(new + own + plan.base_from - base_from, full.shape[4]))
        assert got == expected.tolist(), (new, own, base_len, base_from, prompt)
        assert plan.base_from >= base_from


def _streams(flow: CausalMaskedDiffWithXvec) -> list[dict[str, object]]:
    gen = torch.Generator().manual_seed(1)
    out = []
    for n, trim in (
        (20, ConformerTrim.NONE),
        (35, ConformerTrim.PROMPT_PLUS_TAIL),
        (20, ConformerTrim.PER_RATE),
        (8, ConformerTrim.PROMPT_PLUS_TAIL),
    ):
        tokens = torch.randint(0, 6561, (1, n), generator=gen)
        mel = torch.randn(1, 2 * n, 80, generator=gen)
        spk = torch.randn(1, 192, generator=gen)
        cache = flow.setup_cache(
            tokens, mel, spk, n_timesteps=N_STEPS, lookahead=Lookahead.PROMPT_HEAD, conformer_trim=trim
        )
        out.append({"spk": spk, "ref": cache, "state": FlowRowState.from_setup(cache, project_speaker(flow, spk))})
    return out


def test_batched_chunks_equal_each_stream_alone(reduced_flow: CausalMaskedDiffWithXvec) -> None:
    streams = _streams(reduced_flow)
    gen = torch.Generator().manual_seed(2)
    # Step by step: all first chunks; mixed lengths; a last chunk among middles (padded launch); everyone last.
    plan = [[28, 28, 28, 28], [28, 17, 28, 9], [28, 6, 28, 28], [5, None, 11, 3]]
    for step, lengths in enumerate(plan):
        rows, refs = [], []
        for i, n in enumerate(lengths):
            if n is None:
                continue
            last = step == 3 or (i == 1 and step == 2)
            tokens = torch.randint(0, 6561, (n,), generator=gen)
            s = streams[i]
            mel, s["ref"] = reduced_flow.inference_chunk(tokens[None], s["spk"], s["ref"], last, N_STEPS)  # type: ignore[arg-type]
            rows.append((i, FlowChunkRow(tokens, s["state"], last)))  # type: ignore[arg-type]
            refs.append(mel)
        outs = flow_chunks(reduced_flow, [r for _, r in rows], pad_frames=7 if step == 2 else 0)
        for (i, _), out, mel in zip(rows, outs, refs, strict=True):
            # Bit-equal on the AMD EPYC build hosts; on an AVX-512 Xeon the CPU GEMM picks another kernel for
            # the 3-token last row of step 3 (measured 1.79e-6 max abs of 3.4): rounding, not a different result.
            diff = (out.mel - mel).abs().max().item()
            assert diff <= 1e-5, f"step {step} row {i}: max abs {diff:.2e}"
            streams[i]["state"] = out.state
            if not rows[[j for j, _ in rows].index(i)][1].last:
                ref = streams[i]["ref"].as_dict()  # type: ignore[attr-defined]
                for key, value in out.state.to_stream_cache().as_dict().items():
                    assert torch.equal(value, ref[key]), (step, i, key)


def test_stored_bf16_caches_stay_close_and_halve_the_estimator_cache(reduced_flow: CausalMaskedDiffWithXvec) -> None:
    streams = _streams(reduced_flow)[:2]
    gen = torch.Generator().manual_seed(3)
    fp32 = [s["state"] for s in streams]
    bf16 = [FlowRowState.from_setup(s["ref"], s["state"].speaker, kv_dtype=torch.bfloat16) for s in streams]  # type: ignore[union-attr, arg-type]
    for _ in range(3):
        tokens = [torch.randint(0, 6561, (28,), generator=gen) for _ in streams]
        a = flow_chunks(reduced_flow, [FlowChunkRow(t, st, False) for t, st in zip(tokens, fp32, strict=True)])  # type: ignore[arg-type]
        b = flow_chunks(reduced_flow, [FlowChunkRow(t, st, False) for t, st in zip(tokens, bf16, strict=True)])
        fp32, bf16 = [o.state for o in a], [o.state for o in b]
        for x, y in zip(a, b, strict=True):
            rel = float((x.mel - y.mel).norm() / x.mel.norm())
            assert 0 < rel < 2e-2  # rounded caches move the mel a little, never a lot
    assert bf16[0].estimator_att.own.dtype == torch.bfloat16 and bf16[0].estimator_att.base.dtype == torch.bfloat16
    assert bf16[0].estimator_att.own_nbytes * 2 == fp32[0].estimator_att.own_nbytes


def test_chunks_that_cannot_run_are_rejected_before_launch(reduced_flow: CausalMaskedDiffWithXvec) -> None:
    state = _streams(reduced_flow)[0]["state"]
    with pytest.raises(ValueError, match="a non-final chunk needs at least 2 tokens plus 3 lookahead"):
        check_chunk(reduced_flow, state, [1, 2, 3, 4], False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"speech token 6561 at position 1 is outside \[0, 6561\)"):
        check_chunk(reduced_flow, state, [1, 6561, 3], True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs 5040 relative positions .*cache 40 frames.* table holds 5000"):
        check_chunk(reduced_flow, state, [1] * 2500, True)  # type: ignore[arg-type]
    check_chunk(reduced_flow, state, [1] * 28, False)  # type: ignore[arg-type]
    other = FlowRowState.from_setup(_streams(reduced_flow)[1]["ref"], state.speaker, kv_dtype=torch.bfloat16)  # type: ignore[union-attr, arg-type]
    with pytest.raises(ValueError, match="must share n_timesteps, dtypes and device"):
        flow_chunks(reduced_flow, [FlowChunkRow(torch.ones(28, dtype=torch.long), s, False) for s in (state, other)])  # type: ignore[arg-type]


def test_estimator_kv_validates_its_parts() -> None:
    base = torch.zeros(2, 2, 2, 2, 10, 64)
    kv = EstimatorKV.from_setup(base)
    assert (kv.own_frames, kv.base_frames, kv.frames) == (0, 10, 10) and torch.equal(kv.materialize(), base)
    with pytest.raises(ValueError, match="base_from 11 outside"):
        EstimatorKV(kv.own, base, 11)
    with pytest.raises(ValueError, match="equal leading dims"):
        EstimatorKV(torch.zeros(3, 2, 2, 2, 0, 64), base, 0)
