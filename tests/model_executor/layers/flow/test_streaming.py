# SPDX-License-Identifier: Apache-2.0
"""Streaming: cache layouts, growth and trimming rules, noise offsets, ownership, variants and limits.

Streaming output is not the whole-utterance output (chunks are causal), so these tests pin the
reference streaming semantics as properties instead of comparing the two paths.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.helpers.minicpmo_reference import minicpmo_1_0_7_conformer_trim
from tests.model_executor.layers.flow.inputs import make_prompt, make_tokens
from vllm_omni_token2wav.model_executor.layers.flow import (
    CausalMaskedDiffWithXvec,
    ConformerTrim,
    FlowStreamCache,
    Lookahead,
)
from vllm_omni_token2wav.model_executor.layers.flow.streaming import trim_conformer_cache

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

N_STEPS = 2  # Euler steps: the cache rules do not depend on it; keeps the tests fast
CHUNK, LOOKAHEAD = 25, 3


def _setup(model: CausalMaskedDiffWithXvec, n_prompt: int = 10, **kwargs) -> tuple[FlowStreamCache, torch.Tensor]:
    p_tok, p_mel, spk = make_prompt(n_prompt)
    return model.setup_cache(p_tok, p_mel, spk, N_STEPS, lookahead=Lookahead.PROMPT_HEAD, **kwargs), spk


def _chunks(tokens: torch.Tensor, size: int = CHUNK) -> list[tuple[torch.Tensor, bool]]:
    """The reference driver's split: each chunk + its 3 lookahead tokens; the rest is the last chunk."""
    out, start, n = [], 0, tokens.size(1)
    while n - start > size + LOOKAHEAD:
        out.append((tokens[:, start : start + size + LOOKAHEAD], False))
        start += size
    out.append((tokens[:, start:], True))
    return out


def _storages(cache: FlowStreamCache) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in cache.as_dict().values()}


def test_setup_cache_has_the_reference_layouts(reduced_flow: CausalMaskedDiffWithXvec) -> None:
    cache, _ = _setup(reduced_flow, n_prompt=10)
    p = 20  # prompt mel frames
    assert cache.prompt_frames == p and cache.n_timesteps == N_STEPS
    assert cache.conformer_cnn_cache.shape == (1, 64, 6)
    assert cache.conformer_att_cache.shape == (3, 1, 2, p, 64)  # 2 token-rate layers (tiled) + 1 mel-rate layer
    assert cache.estimator_cnn_cache.shape == (N_STEPS, 2, 2, 128, 2)
    assert cache.estimator_att_cache.shape == (N_STEPS, 2, 2, 2, p, 64)
    token_rate = cache.conformer_att_cache[:2]
    torch.testing.assert_close(token_rate[..., : p // 2, :], token_rate[..., p // 2 :, :], atol=0, rtol=0)


def test_cache_lengths_grow_by_two_frames_per_token_and_trim_to_prompt_plus_100(
    reduced_flow: CausalMaskedDiffWithXvec,
) -> None:
    cache, spk = _setup(reduced_flow, n_prompt=10)
    p, expected_est, expected_conf = 20, 20, 20
    for chunk, last in _chunks(make_tokens(25 * 4 + 7)):
        mel, cache = reduced_flow.inference_chunk(chunk, spk, cache, last, N_STEPS)
        emitted = chunk.size(1) - (0 if last else LOOKAHEAD)
        assert mel.shape == (1, 80, 2 * emitted)
        expected_est += 2 * emitted
        expected_conf += 2 * emitted
        if expected_est > p + 100:
            expected_est = p + 100
        assert cache.estimator_frames == expected_est
        assert cache.conformer_frames == expected_conf  # ConformerTrim.NONE: the conformer cache keeps growing
        assert cache.conformer_cnn_cache.shape == (1, 64, 6)
    assert expected_conf > p + 100, "the stream must be long enough to exercise trimming"


def test_trimming_keeps_the_first_p_and_last_100_frames_of_the_untrimmed_cache(
    reduced_flow: CausalMaskedDiffWithXvec,
) -> None:
    cache, spk = _setup(reduced_flow, n_prompt=10)
    chunks = _chunks(make_tokens(25 * 3 + 3 + 1))
    for chunk, last in chunks[:2]:
        _, cache = reduced_flow.inference_chunk(chunk, spk, cache, last, N_STEPS)
    assert cache.estimator_frames == 120  # 20 + 50 + 50: not trimmed yet
    chunk, last = chunks[2]
    untrimmed_cache = dataclasses.replace(cache, tail_frames=10**6)
    mel_trim, trimmed = reduced_flow.inference_chunk(chunk, spk, cache, last, N_STEPS)
    mel_full, full = reduced_flow.inference_chunk(chunk, spk, untrimmed_cache, last, N_STEPS)
    torch.testing.assert_close(mel_trim, mel_full, atol=0, rtol=0)  # trimming happens after the chunk
    assert full.estimator_frames == 170 and trimmed.estimator_frames == 120
    want = torch.cat([full.estimator_att_cache[..., :20, :], full.estimator_att_cache[..., -100:, :]], dim=4)
    torch.testing.assert_close(trimmed.estimator_att_cache, want, atol=0, rtol=0)


def test_new_cache_prepends_estimator_frames_and_appends_conformer_frames(
    reduced_flow: CausalMaskedDiffWithXvec,
) -> None:
    """Estimator keys/values are newest-first; conformer keys/values oldest-first (reference orders)."""
    cache, spk = _setup(reduced_flow, n_prompt=10)
    chunk = make_tokens(CHUNK + LOOKAHEAD)
    _, new = reduced_flow.inference_chunk(chunk, spk, cache, False, N_STEPS)
    torch.testing.assert_close(new.estimator_att_cache[..., 50:, :], cache.estimator_att_cache, atol=0, rtol=0)
    torch.testing.assert_close(new.conformer_att_cache[2:, ..., :20, :], cache.conformer_att_cache[2:], atol=0, rtol=0)
    old_tokens = cache.conformer_att_cache[:2, ..., :10, :]
    torch.testing.assert_close(new.conformer_att_cache[:2, ..., :10, :], old_tokens, atol=0, rtol=0)
    torch.testing.assert_close(new.conformer_att_cache[:2, ..., 35:45, :], old_tokens, atol=0, rtol=0)  # tile 2


def test_returned_caches_are_fresh_and_the_input_cache_is_never_modified(
    reduced_flow: CausalMaskedDiffWithXvec,
) -> None:
    cache, spk = _setup(reduced_flow, n_prompt=10)
    before = {k: v.clone() for k, v in cache.as_dict().items()}
    chunk = make_tokens(CHUNK + LOOKAHEAD)
    mel_a, new_a = reduced_flow.inference_chunk(chunk, spk, cache, False, N_STEPS)
    mel_b, new_b = reduced_flow.inference_chunk(chunk, spk, cache, False, N_STEPS)
    for key, value in cache.as_dict().items():
        torch.testing.assert_close(value, before[key], atol=0, rtol=0)
    torch.testing.assert_close(mel_a, mel_b, atol=0, rtol=0)
    assert len(_storages(new_a)) == 4
    assert not _storages(new_a) & _storages(cache)
    assert not _storages(new_a) & _storages(new_b)
    assert not _storages(new_a) & {b.untyped_storage().data_ptr() for b in reduced_flow.buffers()}


def test_chunk_noise_is_read_at_the_estimator_cache_offset(fresh_reduced_flow: CausalMaskedDiffWithXvec) -> None:
    model = fresh_reduced_flow
    cache, spk = _setup(model, n_prompt=10)
    off, frames = cache.estimator_frames, 2 * CHUNK
    chunk = make_tokens(CHUNK + LOOKAHEAD)
    base, _ = model.inference_chunk(chunk, spk, cache, False, N_STEPS)
    noise = model.decoder.rand_noise.clone()
    outside = noise.clone()
    outside[..., :off] = 7.0
    outside[..., off + frames :] = -7.0
    model.decoder.set_noise(outside)
    same, _ = model.inference_chunk(chunk, spk, cache, False, N_STEPS)
    torch.testing.assert_close(same, base, atol=0, rtol=0)
    inside = noise.clone()
    inside[..., off : off + frames] += 1.0
    model.decoder.set_noise(inside)
    changed, _ = model.inference_chunk(chunk, spk, cache, False, N_STEPS)
    assert (changed - base).abs().max() > 1e-3


def test_lookahead_tokens_shape_the_chunk_and_the_last_chunk_needs_none(
    reduced_flow: CausalMaskedDiffWithXvec,
) -> None:
    cache, spk = _setup(reduced_flow, n_prompt=10)
    chunk = make_tokens(CHUNK + LOOKAHEAD)
    other = chunk.clone()
    other[0, -LOOKAHEAD:] = (other[0, -LOOKAHEAD:] + 1) % 6561
    a, _ = reduced_flow.inference_chunk(chunk, spk, cache, False, N_STEPS)
    b, _ = reduced_flow.inference_chunk(other, spk, cache, False, N_STEPS)
    assert a.shape == b.shape == (1, 80, 50)
    assert (a - b).abs().max() > 1e-4, "the lookahead tokens must reach the chunk's frames"
    last, _ = reduced_flow.inference_chunk(chunk[:, :CHUNK], spk, cache, True, N_STEPS)
    assert last.shape == (1, 80, 50)


def test_lookahead_variants_append_prompt_head_or_silence(reduced_flow: CausalMaskedDiffWithXvec) -> None:
    p_tok, p_mel, spk = make_prompt(6)
    head = reduced_flow.setup_cache(p_tok, p_mel, spk, N_STEPS, lookahead=Lookahead.PROMPT_HEAD)
    manual = reduced_flow.setup_cache(torch.cat([p_tok, p_tok[:, :3]], 1), p_mel, spk, N_STEPS)
    silence = reduced_flow.setup_cache(p_tok, p_mel, spk, N_STEPS, lookahead=Lookahead.SILENCE)
    manual_silence = reduced_flow.setup_cache(torch.cat([p_tok, torch.full((1, 3), 4218)], 1), p_mel, spk, N_STEPS)
    for a, b in ((head, manual), (silence, manual_silence)):
        for key, value in a.as_dict().items():
            torch.testing.assert_close(value, b.as_dict()[key], atol=0, rtol=0)
    assert not torch.equal(head.estimator_att_cache, silence.estimator_att_cache)


def test_conformer_trim_variant_bounds_the_conformer_cache(reduced_flow: CausalMaskedDiffWithXvec) -> None:
    cache, spk = _setup(reduced_flow, n_prompt=10, conformer_trim=ConformerTrim.PROMPT_PLUS_TAIL)
    lengths = []
    for chunk, last in _chunks(make_tokens(25 * 3 + 7)):
        _, cache = reduced_flow.inference_chunk(chunk, spk, cache, last, N_STEPS)
        lengths.append(cache.conformer_frames)
    assert lengths == [70, 120, 120, 120]
    assert cache.conformer_trim is ConformerTrim.PROMPT_PLUS_TAIL


@pytest.mark.parametrize(("prompt_frames", "length"), [(20, 170), (20, 120), (20, 122), (300, 460), (2, 500)])
def test_per_rate_trim_is_the_1_0_7_rule_for_token_and_mel_rate_layers(prompt_frames: int, length: int) -> None:
    gen = torch.Generator().manual_seed(length)
    token_rate = torch.randn(6, 1, 2, length // 2, 8, generator=gen)
    cache = torch.cat([token_rate.repeat(1, 1, 1, 2, 1), torch.randn(4, 1, 2, length, 8, generator=gen)])
    got = trim_conformer_cache(cache, ConformerTrim.PER_RATE, prompt_frames, 100, token_layers=6, stride=2)
    assert torch.equal(got, minicpmo_1_0_7_conformer_trim(cache, prompt_frames, token_layers=6))
    if length > prompt_frames + 100:
        assert got.shape[3] == prompt_frames + 100
        # vLLM-Omni 0.30's rule cuts the tiled token-rate layers elsewhere: the variants really differ.
        other = trim_conformer_cache(
            cache, ConformerTrim.PROMPT_PLUS_TAIL, prompt_frames, 100, token_layers=6, stride=2
        )
        assert torch.equal(other[6:], got[6:]) and not torch.equal(other[:6], got[:6])
        with pytest.raises(ValueError, match="multiples of the token-to-mel ratio 2"):
            trim_conformer_cache(cache, ConformerTrim.PER_RATE, prompt_frames - 1, 100, token_layers=6, stride=2)
    else:
        assert got is cache


def test_per_rate_streams_equal_a_driver_that_trims_like_minicpmo_utils_1_0_7(
    reduced_flow: CausalMaskedDiffWithXvec,
) -> None:
    """`inference_chunk` with PER_RATE == untrimmed chunks + the 1.0.7 trim after every call (its driver)."""
    cache, spk = _setup(reduced_flow, n_prompt=10, conformer_trim=ConformerTrim.PER_RATE)
    driver, _ = _setup(reduced_flow, n_prompt=10)
    token_layers, lengths = len(reduced_flow.encoder.encoders), []
    for chunk, last in _chunks(make_tokens(25 * 5 + 11)):
        mel, cache = reduced_flow.inference_chunk(chunk, spk, cache, last, N_STEPS)
        ref_mel, driver = reduced_flow.inference_chunk(chunk, spk, driver, last, N_STEPS)
        driver = dataclasses.replace(
            driver, conformer_att_cache=minicpmo_1_0_7_conformer_trim(driver.conformer_att_cache, 20, token_layers)
        )
        assert torch.equal(mel, ref_mel)
        assert torch.equal(cache.conformer_att_cache, driver.conformer_att_cache)
        lengths.append(cache.conformer_frames)
    assert lengths == [70, 120, 120, 120, 120, 120]  # trimmed from chunk 3 on, so later chunks read trimmed caches


def test_cache_over_the_1000_frame_scratch_limit_is_a_clear_error(reduced_flow: CausalMaskedDiffWithXvec) -> None:
    cache, spk = _setup(reduced_flow, n_prompt=480)  # 960 prompt frames (19.2 s)
    with pytest.raises(ValueError, match=r"960 frames\) \+ chunk \(50 frames\) = 1010 > 1000"):
        reduced_flow.inference_chunk(make_tokens(CHUNK + LOOKAHEAD), spk, cache, False, N_STEPS)


def test_positional_table_exhaustion_is_a_clear_error(reduced_flow: CausalMaskedDiffWithXvec) -> None:
    enc = reduced_flow.encoder
    att = torch.zeros(3, 1, 2, 2 * 2490, 64)
    cnn = torch.zeros(1, 64, 6)
    xs = torch.zeros(1, CHUNK + LOOKAHEAD, 64)
    with pytest.raises(ValueError, match="5030 positions requested but the relative positional table holds 5000"):
        enc.forward_chunk(xs, False, cnn, att)


def test_bad_streaming_inputs_are_rejected(reduced_flow: CausalMaskedDiffWithXvec) -> None:
    p_tok, p_mel, spk = make_prompt(6)
    with pytest.raises(ValueError, match="did you forget the lookahead tokens"):
        reduced_flow.setup_cache(p_tok, p_mel, spk, N_STEPS)
    with pytest.raises(ValueError, match=r"allowed \[0, 6561\)"):
        reduced_flow.setup_cache(torch.cat([p_tok, -torch.ones(1, 3, dtype=torch.long)], 1), p_mel, spk, N_STEPS)
    cache = reduced_flow.setup_cache(p_tok, p_mel, spk, N_STEPS, lookahead=Lookahead.SILENCE)
    chunk = make_tokens(CHUNK + LOOKAHEAD)
    with pytest.raises(ValueError, match="n_timesteps=10 but the cache was set up with 2"):
        reduced_flow.inference_chunk(chunk, spk, cache, False, 10)
    bad = chunk.clone()
    bad[0, 3] = 7000
    with pytest.raises(ValueError, match=r"ids span \[\d+, 7000\], allowed \[0, 6561\)"):
        reduced_flow.inference_chunk(bad, spk, cache, False, N_STEPS)
    with pytest.raises(ValueError, match="non-final chunk needs at least 2 tokens"):
        reduced_flow.inference_chunk(chunk[:, :4], spk, cache, False, N_STEPS)
    with pytest.raises(TypeError, match="FlowStreamCache"):
        reduced_flow.inference_chunk(chunk, spk, cache.as_dict(), False, N_STEPS)  # type: ignore[arg-type]
