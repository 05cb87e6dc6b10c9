# SPDX-License-Identifier: Apache-2.0
"""Chunks of many causal-HiFT streams in one launch: rows at different positions stacked into one state.

A `CausalHiFTStreamState` advances its rows together, and a serving stage holds one state per
request, each at its own position in its utterance. What a `push` computes depends on a state's
absolute position in only two ways: the noise table is read at each row's own sample (per-row
cursors, `stream._read_noise`) and the phase is each row's own (a [B, H] tensor). Every slice and
pad inside a step is a function of the state's *relative* geometry: frames received but not yet
through the F0 predictor / the decoder / the output, whether each of those is still at the
signal start, the buffered excitation and conv_post lengths, the contexts' shapes. Rows whose
geometry, chunk length and finalize flag agree (`launch_key`) are therefore stacked along the
batch dimension, pushed once, and split back, each row keeping its own counters, noise cursor
and tensors. Steady-state chunks of a stage (50 frames, non-final) all share one key whatever
their position, so they share one launch as HiFT's do (`cosyvoice2.hift.batched.vocode_chunks`).

Exactness: a row's audio equals its solo push up to the batched float32 convolutions (measured
<= 1e-7 on the stand-ins; the tests require 1e-6). The F0 predictor runs batched in float64.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from types import MappingProxyType

import torch

from vllm_omni_token2wav.model_executor.layers.hift_causal.noise import NoiseCursor
from vllm_omni_token2wav.model_executor.layers.hift_causal.stream import CausalHiFTStreamer, CausalHiFTStreamState

_COUNTERS = ("received", "f0_done", "decoded", "emitted")


def launch_key(state: CausalHiFTStreamState, frames: int, finalize: bool) -> Hashable:
    """Rows whose keys are equal may share one `push_rows` launch (see the module docstring)."""
    return (
        state.layout,
        frames,
        finalize,
        state.finalized,
        state.silence_pending,
        state.received - state.f0_done,
        state.received - state.decoded,
        state.received - state.emitted,
        state.f0_done == 0,
        state.decoded == 0,
        state.emitted == 0,
        tuple(state.source_tail.shape[1:]),
        tuple(state.post.shape[1:]),
        tuple(sorted((name, tuple(t.shape[1:])) for name, t in state.contexts.items())),
    )


def _cursors(state: CausalHiFTStreamState) -> list[NoiseCursor]:
    return list(state.noise) if isinstance(state.noise, tuple) else [state.noise] * state.batch


def _stack(states: Sequence[CausalHiFTStreamState]) -> CausalHiFTStreamState:
    first = states[0]
    contexts = {name: torch.cat([s.contexts[name] for s in states]) for name in first.contexts}
    return dataclasses.replace(
        first,
        batch=sum(s.batch for s in states),
        mel_tail=torch.cat([s.mel_tail for s in states]),
        phase=torch.cat([s.phase for s in states]),
        noise=tuple(c for s in states for c in _cursors(s)),
        source_tail=torch.cat([s.source_tail for s in states]),
        post=torch.cat([s.post for s in states]),
        contexts=MappingProxyType(contexts),
    )


def _split(
    states: Sequence[CausalHiFTStreamState], stacked: CausalHiFTStreamState, after: CausalHiFTStreamState
) -> list[CausalHiFTStreamState]:
    """Each input state advanced like `stacked` -> `after`, holding its own rows (fresh tensors)."""
    assert isinstance(after.noise, tuple)
    advance = {name: getattr(after, name) - getattr(stacked, name) for name in _COUNTERS}
    out, row = [], 0
    for state in states:
        rows = slice(row, row + state.batch)
        cursors = after.noise[rows]
        out.append(
            dataclasses.replace(
                after,
                batch=state.batch,
                **{name: getattr(state, name) + step for name, step in advance.items()},
                mel_tail=after.mel_tail[rows].clone(),
                phase=after.phase[rows].clone(),
                # A state whose rows shared one cursor keeps one (they advanced by the same samples).
                noise=cursors if isinstance(state.noise, tuple) else cursors[0],
                source_tail=after.source_tail[rows].clone(),
                post=after.post[rows].clone(),
                contexts=MappingProxyType({name: t[rows].clone() for name, t in after.contexts.items()}),
            )
        )
        row += state.batch
    return out


def push_rows(
    streamer: CausalHiFTStreamer,
    states: Sequence[CausalHiFTStreamState],
    mels: Sequence[torch.Tensor],
    *,
    finalize: bool = False,
) -> list[tuple[torch.Tensor, CausalHiFTStreamState]]:
    """`streamer.push(state_i, mel_i, finalize=finalize)` for every row, in one launch.

    All rows must share `launch_key(state, frames, finalize)`; the states passed in are not
    modified. Returns (audio [B_i, samples], next state) per input, in input order.
    """
    if len(states) != len(mels):
        raise ValueError(f"push_rows: {len(states)} states but {len(mels)} mel chunks")
    if not states:
        return []
    keys = {launch_key(s, int(m.shape[-1]), finalize) for s, m in zip(states, mels, strict=True)}
    if len(keys) > 1:
        raise ValueError(
            f"push_rows: the {len(states)} rows have {len(keys)} different geometries; group them by "
            "launch_key(state, frames, finalize) first"
        )
    if len(states) == 1:
        return [streamer.push(states[0], mels[0], finalize=finalize)]
    stacked = _stack(states)
    audio, after = streamer.push(stacked, torch.cat(list(mels)), finalize=finalize)
    split = _split(states, stacked, after)
    out, row = [], 0
    for state, next_state in zip(states, split, strict=True):
        out.append((audio[row : row + state.batch], next_state))
        row += state.batch
    return out


__all__ = ["launch_key", "push_rows"]
