# SPDX-License-Identifier: Apache-2.0
"""Which chunks of a step run together: the launch plan, as plain data you can print and test.

Input: one `PlanItem` per chunk that passed admission, carrying only its `ChunkShape` (host
integers and keys from the backend). Output: a `StepPlan`, the flow launches then the vocoder
launches, each a `Launch` listing its rows in launch order:

- flow launches group rows by `flow_key` (same step count and dtypes); within a launch rows are
  ordered by `attention_key` (equal shapes adjacent, so the kernels share attention calls between
  them), ties in input order; at most `max_rows` rows per launch;
- vocoder launches group rows by `vocoder_key` (equal mel length and cache presence; steady-state
  chunks of every stream share one), at most `max_rows` rows each.

With `pad_to_buckets` (graph capture) a flow launch's total frames are rounded up to a
`stage_frame_buckets()` size and a vocoder launch's rows to a `batch_buckets()` size, from
`vllm_omni_token2wav.model_executor.buckets` (the one place that decides padded shapes); a size above the
largest bucket runs exactly. The kernels make padding exact: padded frames and rows never reach a
real row. CPU runs unpadded by default.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from vllm_omni_token2wav.model_executor import buckets
from vllm_omni_token2wav.model_executor.models.token2wav_stage.backend import ChunkShape


@dataclass(frozen=True)
class PlanItem:
    """A chunk to plan: `item` is the caller's index for it; `request_id` is for printing only."""

    item: int
    request_id: str
    shape: ChunkShape


@dataclass(frozen=True)
class Launch:
    """One kernel launch: `rows` are item indices in launch order; `pad` extra frames (flow) or rows (vocoder)."""

    kind: str  # "flow", "vocoder" or "whole" (whole utterances: `frames` counts their tokens)
    key: str
    rows: tuple[int, ...]
    frames: int
    pad: int = 0

    def describe(self, names: dict[int, str]) -> str:
        who = ", ".join(names.get(r, str(r)) for r in self.rows)
        unit = {"flow": "frames", "whole": "tokens"}.get(self.kind, "rows")
        size = len(self.rows) if unit == "rows" else self.frames
        return f"{self.kind:7s} {len(self.rows):2d} rows  {size:5d} {unit} +{self.pad:<4d} key={self.key}  [{who}]"


@dataclass(frozen=True)
class StepPlan:
    flow: tuple[Launch, ...] = ()
    vocoder: tuple[Launch, ...] = ()
    names: dict[int, str] = field(default_factory=dict)
    #: whole utterances (`plan_whole`), rows numbered in their own list
    whole: tuple[Launch, ...] = ()
    whole_names: dict[int, str] = field(default_factory=dict)

    def describe(self) -> str:
        lines = [launch.describe(self.names) for launch in (*self.flow, *self.vocoder)]
        lines += [launch.describe(self.whole_names) for launch in self.whole]
        return "\n".join(lines) if lines else "(nothing to launch)"

    def __str__(self) -> str:
        return self.describe()


def _chunks(rows: list[int], size: int) -> list[list[int]]:
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def plan_whole(tokens: Sequence[int], *, max_rows: int, batched: bool) -> tuple[Launch, ...]:
    """Launches of a step's whole utterances (`tokens[i]`: utterance i's ids): in input order, at most `max_rows`
    per launch when the backend runs several in one (`batched`: it has `whole_rows`), else one each."""
    if max_rows < 1:
        raise ValueError(f"plan_whole: max_rows must be >= 1, got {max_rows}")
    size = max_rows if batched else 1
    parts = _chunks(list(range(len(tokens))), size)
    return tuple(Launch("whole", "whole", tuple(p), sum(tokens[r] for r in p)) for p in parts)


def _key_text(key: Hashable) -> str:
    return str(key).replace(" ", "")


def plan_step(items: Sequence[PlanItem], *, max_rows: int, pad_to_buckets: bool = False) -> StepPlan:
    """Group `items` into flow and vocoder launches (see the module docstring)."""
    if max_rows < 1:
        raise ValueError(f"plan_step: max_rows must be >= 1, got {max_rows}")
    by_item = {it.item: it for it in items}
    flow_groups: dict[Hashable, list[int]] = {}
    voc_groups: dict[Hashable, list[int]] = {}
    for it in items:
        flow_groups.setdefault(it.shape.flow_key, []).append(it.item)
        voc_groups.setdefault(it.shape.vocoder_key, []).append(it.item)

    order = {it.item: pos for pos, it in enumerate(items)}
    flow = []
    for key, rows in flow_groups.items():
        # Equal attention shapes adjacent (stable: first appearance of each shape, then input order).
        first_seen: dict[Hashable, int] = {}
        for r in rows:
            first_seen.setdefault(by_item[r].shape.attention_key, order[r])
        rows = sorted(rows, key=lambda r: (first_seen[by_item[r].shape.attention_key], order[r]))
        for part in _chunks(rows, max_rows):
            frames = sum(by_item[r].shape.flow_frames for r in part)
            pad = 0
            if pad_to_buckets:
                bucket = buckets.stage_frame_buckets().round_up(frames)
                pad = 0 if bucket is None else bucket - frames
            flow.append(Launch("flow", _key_text(key), tuple(part), frames, pad))
    vocoder = []
    for key, rows in voc_groups.items():
        for part in _chunks(rows, max_rows):
            pad = 0
            if pad_to_buckets:
                bucket = buckets.batch_buckets().round_up(len(part))
                pad = 0 if bucket is None else bucket - len(part)
            frames = sum(by_item[r].shape.flow_frames for r in part)
            vocoder.append(Launch("vocoder", _key_text(key), tuple(part), frames, pad))
    names = {it.item: it.request_id for it in items}
    return StepPlan(tuple(flow), tuple(vocoder), names)


__all__ = ["Launch", "PlanItem", "StepPlan", "plan_step", "plan_whole"]
