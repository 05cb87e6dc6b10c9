# SPDX-License-Identifier: Apache-2.0
"""The stage's own cost per row, measured online, and the planning rule that uses it (issue 32, item 1).

Why: a step of whole utterances (code2wav alone, a pipeline's sync path) finishes every request of the batch
at its end. Where an extra row costs nearly a request alone (a CPU), batching N requests makes the first wait
for all N; where rows are cheap (an accelerator) batching costs the first almost nothing. Only the scheduler
can choose how many requests a step runs (vLLM-Omni finishes a whole request after the step that scheduled
its prompt), so the stage measures and the scheduler decides:

- `CostEstimator` (stage side, one per stage process, so per device) fits the step's wall time of steps that
  ran whole utterances only, `seconds ~= base_s + row_s * rows + token_s * tokens` (tokens: the codec ids of
  the step), by exponentially forgotten least squares (`DECAY` per step) with every coefficient >= 0 (a negative
  one is fixed at 0, the others refitted), pulled towards its previous fit in
  directions the recent steps do not excite (all steps with the same row count cannot tell `base_s` from
  `row_s`; all requests of one length cannot tell `row_s` from `token_s`).
- `CostModel.encode()` is what the stage publishes under `COST_KEY` on each step's output (a float64 tensor on
  the step's first segment, an empty one on the others: vLLM-Omni's runner calls `.detach()` on every entry);
  the engine-core patch `patch/worker/patch_generation_scheduler.py` takes it off the model runner's output and
  keeps the latest on the scheduler.
- `whole_rows_to_admit(tokens, model)` is the rule the scheduler patch (`patch/worker/patch_latency_planning.py`)
  applies to the waiting whole utterances, in arrival order: admit one more row while doing so does not raise
  the sum of the batch's completion times over running that row next, alone:
  `(k + 1) * marginal(row) <= alone(row)` for a batch that already holds `k` rows (the `k` earlier requests each
  finish `marginal` later; the new one finishes `alone - marginal` earlier than it would after them). With no
  solo step measured yet the rule answers 1 (a solo probe), with no batched step measured it answers 2 (the
  smallest batch that tells the per-row cost), and the scheduler runs upstream's policy while no model exists.

`STREAM_META_KEYS` names the request fields that make a request a stream chunk (never held back); the scheduler
reads them from the request's `additional_information` (`carries_stream_meta`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import torch

__all__ = [
    "COST_KEY",
    "DECAY",
    "LATENCY_PLANNING_KEY",
    "STREAM_META_KEYS",
    "CostEstimator",
    "CostModel",
    "carries_stream_meta",
    "latency_planning_enabled",
    "whole_rows_to_admit",
]

#: The `multimodal_outputs` key of the published cost model (taken off by the engine-core patch).
COST_KEY: Final = "token2wav_cost"
#: The stage's `additional_config` switch (default on); false: the scheduler runs upstream's policy.
LATENCY_PLANNING_KEY: Final = "token2wav_latency_planning"
#: Per-step forgetting of the fit's statistics (an effective memory of ~1 / (1 - DECAY) = 20 steps).
DECAY: Final = 0.95
#: Fields of a request's `additional_information` (top level, under `meta`, or as `meta.<key>`) that mark a
#: stream chunk: every family's chunk marker, prefix offset and end marker, and the producers' positions.
STREAM_META_KEYS: Final = frozenset(
    {"chunk_seq", "cache_epoch", "last_chunk", "left_context_size", "stream_finished", "finished"}
)
_FIELDS: Final = 6  # base_s, row_s, token_s, samples, solo_seen, batch_seen


@dataclass(frozen=True)
class CostModel:
    """Predicted wall seconds of a step of whole utterances: `base_s + row_s * rows + token_s * tokens`."""

    base_s: float
    row_s: float
    token_s: float
    samples: int
    solo_seen: bool  # a step with one row was measured (`base_s` is told apart from `row_s`)
    batch_seen: bool  # a step with more rows was measured

    def alone_s(self, tokens: int) -> float:
        """One request of `tokens` codec ids in a step alone."""
        return self.base_s + self.row_s + self.token_s * tokens

    def marginal_s(self, tokens: int) -> float:
        """What a request of `tokens` codec ids adds to a step that already runs others."""
        return self.row_s + self.token_s * tokens

    def encode(self) -> torch.Tensor:
        """The model as a 1-D float64 CPU tensor (`decode` reads it back)."""
        values = [self.base_s, self.row_s, self.token_s, self.samples, self.solo_seen, self.batch_seen]
        return torch.tensor([float(v) for v in values], dtype=torch.float64)

    @classmethod
    def decode(cls, t: Any) -> CostModel | None:
        """The model `encode` wrote; None for None, an empty tensor or one of another length / non-finite values."""
        if not isinstance(t, torch.Tensor) or t.numel() != _FIELDS:
            return None
        v = t.detach().to("cpu", torch.float64).reshape(-1).tolist()
        if not all(math.isfinite(x) for x in v):
            return None
        return cls(v[0], v[1], v[2], int(v[3]), bool(v[4]), bool(v[5]))


@dataclass
class CostEstimator:
    """Exponentially forgotten least squares of step seconds on `[1, rows, tokens]` (module docstring)."""

    decay: float = DECAY
    ridge: float = 1e-3  # pull towards the previous fit, relative to each feature's own weight
    min_samples: int = 2
    _gram: torch.Tensor = field(default_factory=lambda: torch.zeros(3, 3, dtype=torch.float64))
    _moment: torch.Tensor = field(default_factory=lambda: torch.zeros(3, dtype=torch.float64))
    _theta: torch.Tensor = field(default_factory=lambda: torch.zeros(3, dtype=torch.float64))
    samples: int = 0
    solo_seen: bool = False
    batch_seen: bool = False

    def record(self, rows: int, tokens: int, seconds: float) -> None:
        """One measured step of `rows` whole utterances holding `tokens` codec ids in all."""
        if rows < 1 or not math.isfinite(seconds) or seconds < 0:
            return
        x = torch.tensor([1.0, float(rows), float(tokens)], dtype=torch.float64)
        self._gram.mul_(self.decay).add_(torch.outer(x, x))
        self._moment.mul_(self.decay).add_(x * seconds)
        self.samples += 1
        self.solo_seen |= rows == 1
        self.batch_seen |= rows > 1
        weight = self.ridge * torch.diagonal(self._gram).clamp_min(1e-12)
        self._theta = _non_negative_solve(self._gram + torch.diag(weight), self._moment + weight * self._theta)

    def model(self) -> CostModel | None:
        """The current fit, None before `min_samples` steps were measured."""
        if self.samples < self.min_samples:
            return None
        base, row, token = (float(v) for v in self._theta)
        return CostModel(base, row, token, self.samples, self.solo_seen, self.batch_seen)


def _non_negative_solve(lhs: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """`lhs @ x = rhs` with every coefficient >= 0: a negative one is fixed at 0 and the rest solved again.

    A fixed cost, a cost per row and a cost per token are never negative; an unconstrained fit of a few noisy steps
    (a host under load, rows and tokens rising together) gave `row_s < 0` or `token_s < 0`, i.e. "an extra row
    saves time", and the rule then batched every waiting request on a CPU.
    """
    free = list(range(rhs.numel()))
    x = torch.zeros_like(rhs)
    while free:
        index = torch.tensor(free)
        sub = torch.linalg.solve(lhs[index][:, index], rhs[index])
        if bool((sub >= 0).all()):
            x[index] = sub
            break
        free = [i for i, v in zip(free, sub.tolist(), strict=True) if v >= 0]
    return x


def whole_rows_to_admit(tokens: Sequence[int], model: CostModel) -> int:
    """How many of the waiting whole utterances (their codec-id counts, in arrival order) one step should run."""
    if not tokens:
        return 0
    if not model.solo_seen:
        return 1  # probe: one measured solo step tells the fixed cost from the per-row cost
    if not model.batch_seen:
        return min(2, len(tokens))  # probe: the smallest batch that tells the per-row cost
    admitted = 1
    for k, count in enumerate(tokens[1:], start=1):
        if (k + 1) * model.marginal_s(count) > model.alone_s(count):
            break
        admitted += 1
    return admitted


def carries_stream_meta(info: Mapping[str, Any] | None) -> bool:
    """Whether a request's `additional_information` marks it as a stream chunk (`STREAM_META_KEYS`)."""
    if not isinstance(info, Mapping):
        return False
    meta = info.get("meta")
    for key in STREAM_META_KEYS:
        if info.get(key) is not None or info.get(f"meta.{key}") is not None:
            return True
        if isinstance(meta, Mapping) and meta.get(key) is not None:
            return True
    return False


def latency_planning_enabled(additional_config: Any) -> bool:
    """The stage's `token2wav_latency_planning` (true / false, default true); ValueError for anything else."""
    if not isinstance(additional_config, Mapping) or additional_config.get(LATENCY_PLANNING_KEY) is None:
        return True
    value = additional_config[LATENCY_PLANNING_KEY]
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"additional_config.{LATENCY_PLANNING_KEY} must be true or false, got {value!r}")
