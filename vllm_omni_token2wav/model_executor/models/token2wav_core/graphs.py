# SPDX-License-Identifier: Apache-2.0
"""Which calls of the Token2Wav stage are replayed from device graphs, and how many graphs that makes.

On an accelerator a streaming chunk is launch-bound: the DiT estimator runs `2 x depth x
n_timesteps` blocks of small kernels per flow launch, and HiFT a few hundred per vocoder launch.
`StageGraphs` captures both through `platforms.device_graphs.DeviceGraphRunner`:

| call                  | captured as                                   | key (one graph per key and runner)    |
|-----------------------|-----------------------------------------------|---------------------------------------|
| estimator Euler step  | `depth + 1` segments between the attention    | the launch's frames N (a stage        |
| (CFG pair = batch 2)  | calls (`flow.estimator_segments`)             | bucket); rows only as `max_rows`      |
| HiFT                  | noise drawn ahead, network and iSTFT          | (rows bucket, mel frames, cached      |
|                       | replayed (`hift.graphed`)                     | samples), captured at its 2nd call    |

The conformer encoder (per row, ~3 % of a chunk's arithmetic), the attention (reads and writes
each stream's own cache) and the step's bookkeeping stay eager.

Bounded keys. With graphs on, the planner pads every flow launch's frames to
`buckets.stage_frame_buckets()` (36 sizes by default; at most 1792 frames for 32 rows) and every
vocoder launch's rows to `buckets.batch_buckets()`, so the estimator has at most one key per
frame bucket and HiFT one per (batch bucket, chunk shape): steady-state chunks, first chunks, and
last chunks of each length that recurs. Each runner also keeps at most `max_graphs` graphs
(`VLLM_OMNI_TOKEN2WAV_DEVICE_GRAPHS_MAX`, LRU). Counts measured on stage runs are in
docs/design/token2wav_stage.md ("Graph capture").

Memory: a segment graph keeps its static inputs and outputs, about `7 x 2 x N x hidden x 4` bytes
(51 MB at N = 1792, hidden 512) per segment and key, so the worst case (every bucket captured,
17 segments) is ~11 GB at full size; real traffic touches a few buckets.

Switch: the stage option `token2wav_device_graphs` (None: follow `VLLM_OMNI_TOKEN2WAV_DEVICE_GRAPHS` and the
platform; False: no capture objects at all, the plain eager path; True: on even when the
environment says off). CPU and platforms without a graph API run the same segment code eagerly.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.layers.flow.estimator_segments import EstimatorGraphs
from vllm_omni_token2wav.model_executor.layers.hift.graphed import GraphedHiFT
from vllm_omni_token2wav.platforms.device_graphs import FROM_PLATFORM, GraphCounters, GraphKey, describe_key

logger = init_logger(__name__)


class StageGraphs:
    """The estimator segments and HiFT of one stage's models, each behind its graph runners.

    `enabled` / `graph_api` / `max_graphs` go to every runner (`DeviceGraphRunner` semantics);
    `max_rows` is the stage's rows per launch (the estimator's fixed conv-context row count).
    """

    def __init__(
        self,
        flow: Any,
        hift: Any | None,
        *,
        max_rows: int,
        device: torch.device,
        enabled: bool | None = None,
        graph_api: Any = FROM_PLATFORM,
        max_graphs: int | None = None,
    ) -> None:
        options: dict[str, Any] = {"enabled": enabled, "graph_api": graph_api, "max_graphs": max_graphs}
        self.estimator = EstimatorGraphs(flow.decoder.estimator, context_rows=max_rows, device=device, **options)
        # None: the stream's vocoder has no HiFT to replay (MiniCPM-o 1.0.7's causal vocoder runs eagerly).
        self.hift = GraphedHiFT(hift, device=device, **options) if hift is not None else None
        logger.info(
            "token2wav stage graphs: %s (estimator %d segments, rows <= %d; %s)",
            self.estimator.runners[0].backend if self.active else "off, eager",
            len(self.estimator.runners),
            max_rows,
            "HiFT" if self.hift is not None else "vocoder eager",
        )

    @property
    def active(self) -> bool:
        """Whether calls replay graphs (False: the same code runs eagerly)."""
        return self.estimator.active

    def counters(self) -> list[GraphCounters]:
        return [*self.estimator.counters(), *([] if self.hift is None else [self.hift.counters()])]

    def keys(self) -> dict[str, list[GraphKey]]:
        """Captured keys per runner, least recently used first."""
        hift = [] if self.hift is None else [self.hift.runner]
        return {r.name: r.captured_keys() for r in (*self.estimator.runners, *hift)}

    def summary(self) -> dict[str, Any]:
        """Totals for reports: graphs, captures, replays, eager calls and the keys of one estimator segment and HiFT."""
        counters = self.counters()
        estimator = counters[: len(self.estimator.runners)]
        keys = self.keys()
        return {
            "backend": counters[0].backend,
            "active": self.active,
            "estimator_segments": len(estimator),
            "estimator_keys": [describe_key(k) for k in keys[estimator[0].name]],
            "hift_keys": [] if self.hift is None else [describe_key(k) for k in keys[self.hift.runner.name]],
            "graphs": sum(c.graphs for c in counters),
            "captures": sum(c.captures for c in counters),
            "replays": sum(c.replays for c in counters),
            "eager_fallbacks": sum(c.eager_fallbacks for c in counters),
            "estimator_eager_launches": self.estimator.eager_launches,
            "evictions": sum(c.evictions for c in counters),
            "failures": sum(c.failures for c in counters),
            "capture_ms": sum(c.capture_ms for c in counters),
        }

    def clear(self) -> None:
        self.estimator.clear()
        if self.hift is not None:
            self.hift.runner.clear()


__all__ = ["StageGraphs"]
