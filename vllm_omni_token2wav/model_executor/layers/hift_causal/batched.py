# SPDX-License-Identifier: Apache-2.0
"""Several requests' causal-HiFT chunks in one launch: stack their stream states, push once, split.

A `CausalHiFTStreamState` holds B rows that advance together (`stream.py`). Rows of different
requests can share a push when everything that decides the work is the same for them: the frame
counters (received, F0 done, decoded, emitted), finalization, the pending leading silence, the number
of new mel frames and whether the push is final. The noise table is indexed by absolute sample and is
the same for every request, so rows at equal counters also read the same noise window (one cursor).
What differs per row (mel tail, phase, excitation tail, conv_post frames, every conv's context) is
stacked along the batch dimension; `push_key` is the grouping key a planner uses.

Exactness: the F0 predictor runs in float64 and the sine source is elementwise, so they are row-wise
identical; the decoder's float32 convolutions see batch B instead of 1, which CPU kernels may round
differently by an ulp (measured in docs/design/cosyvoice3.md, "Cross-request batching").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from types import MappingProxyType

import torch

from vllm_omni_token2wav.model_executor.layers.hift_causal.stream import CausalHiFTStreamer, CausalHiFTStreamState


def push_key(state: CausalHiFTStreamState, frames: int, finalize: bool) -> Hashable:
    """Rows whose keys are equal may share a push (see the module docstring)."""
    return (
        state.received,
        state.f0_done,
        state.decoded,
        state.emitted,
        state.finalized,
        state.silence_pending,
        state.noise.position,
        frames,
        finalize,
    )


def _stack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(list(tensors), dim=0)


def stack_states(states: Sequence[CausalHiFTStreamState]) -> CausalHiFTStreamState:
    """One state of `sum(batch)` rows from states at equal counters (ValueError naming what differs)."""
    if not states:
        raise ValueError("stack_states needs at least one state")
    first = states[0]
    for other in states[1:]:
        if other.layout != first.layout:
            raise ValueError("stack_states: states of different vocoder setups (config, policy, noise or devices)")
        if push_key(other, 0, False) != push_key(first, 0, False):
            raise ValueError(
                f"stack_states: states at different positions ({push_key(other, 0, False)} vs "
                f"{push_key(first, 0, False)}); only rows at equal counters can share a push"
            )
        if set(other.contexts) != set(first.contexts):
            raise ValueError("stack_states: states carry different conv contexts")
    if len(states) == 1:
        return first
    contexts = {name: _stack([s.contexts[name] for s in states]) for name in first.contexts}
    return dataclasses.replace(
        first,
        batch=sum(s.batch for s in states),
        mel_tail=_stack([s.mel_tail for s in states]),
        phase=_stack([s.phase for s in states]),
        source_tail=_stack([s.source_tail for s in states]),
        post=_stack([s.post for s in states]),
        contexts=MappingProxyType(contexts),
    )


def split_state(state: CausalHiFTStreamState, sizes: Sequence[int]) -> list[CausalHiFTStreamState]:
    """The per-request states of a stacked one (`sizes`: rows of each, summing to `state.batch`)."""
    if sum(sizes) != state.batch or any(n < 1 for n in sizes):
        raise ValueError(f"split_state: sizes {list(sizes)} must be >= 1 and sum to the state's {state.batch} rows")
    if len(sizes) == 1:
        return [state]
    out, start = [], 0
    for n in sizes:

        def rows(t: torch.Tensor, start: int = start, n: int = n) -> torch.Tensor:
            return t[start : start + n].clone()  # own storage: a request's state must not pin the batch's

        out.append(
            dataclasses.replace(
                state,
                batch=n,
                mel_tail=rows(state.mel_tail),
                phase=rows(state.phase),
                source_tail=rows(state.source_tail),
                post=rows(state.post),
                contexts=MappingProxyType({name: rows(t) for name, t in state.contexts.items()}),
            )
        )
        start += n
    return out


def push_rows(
    streamer: CausalHiFTStreamer,
    states: Sequence[CausalHiFTStreamState],
    mels: Sequence[torch.Tensor],
    *,
    finalize: bool,
    pad_rows: int = 0,
) -> list[tuple[torch.Tensor, CausalHiFTStreamState]]:
    """`streamer.push(state_i, mel_i, finalize=finalize)` for rows at equal counters, as one push.

    Each mel is `[batch_i, 80, n]` with the same n. `pad_rows` repeats the first row that many times
    (graph-capture batch sizes); their outputs are dropped. Returns `(audio [batch_i, samples], state)`
    per input row, in order.
    """
    frames = {int(m.shape[-1]) for m in mels}
    if len(frames) != 1 or len(mels) != len(states):
        raise ValueError(f"push_rows: one mel per state with equal frame counts, got {sorted(frames)}")
    sizes = [s.batch for s in states]
    padded_states = list(states) + [states[0]] * pad_rows
    padded_mels = list(mels) + [mels[0]] * pad_rows
    audio, state = streamer.push(stack_states(padded_states), _stack(padded_mels), finalize=finalize)
    pieces = split_state(state, sizes + [states[0].batch] * pad_rows)
    out, start = [], 0
    for n, piece in zip(sizes, pieces, strict=False):
        out.append((audio[start : start + n], piece))
        start += n
    return out


__all__ = ["push_key", "push_rows", "split_state", "stack_states"]
