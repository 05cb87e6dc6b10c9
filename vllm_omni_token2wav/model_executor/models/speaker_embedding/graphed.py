# SPDX-License-Identifier: Apache-2.0
"""CAM++ replayed from device graphs: the torch speaker embedding without per-kernel launch cost.

On an accelerator the folded CAM++ (`campplus.inference`) is launch-bound: a call is a few hundred
small kernels (~11 MFLOP per frame, microseconds of H200 compute at T=200), so eager latency is the
launch overhead. `GraphedCampplus` is `CampplusTorch` with its forward routed through
`platforms.device_graphs.DeviceGraphRunner`: one CUDA / NPU graph per input shape, captured on the
first call of that shape (or at `warmup()`), replayed afterwards; eager where the platform has no
graphs (CPU) or graphs are switched off (`VLLM_OMNI_TOKEN2WAV_DEVICE_GRAPHS=0`).

Graphs are keyed by (batch bucket, frame bucket): with graphs active, every call is an
`embed_batch` launch (`CampplusTorch.plan`: frames padded to `buckets.campplus_frame_buckets()`,
rows to `buckets.batch_buckets()`), run by the padded, exactly masked CAM++ forward
(`CampplusInference(x, lengths)`, static shapes, no host reads), so a few dozen graphs cover every
prompt length and batch; a single `__call__` is a one-row launch. Lengths above the largest frame
bucket run at their own shape (one graph each, LRU-evicted beyond the runner's cap). Eager, a call
runs at its exact length like `CampplusTorch`. This is the thin adapter the device check uses.

Numerics are those of `CampplusTorch` (the graph replays the same kernels; the runner verifies the
first replay of each graph against an eager run).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.dtdnn import CAMPPlus
from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import (
    DEFAULT_SEG_POOL_MODE,
    FEAT_DIM,
    MIN_FRAMES,
    CampplusTorch,
    load_campplus_from_onnx,
)
from vllm_omni_token2wav.platforms.device import DeviceSpec, device_key
from vllm_omni_token2wav.platforms.device_graphs import DeviceGraphRunner, GraphCounters


class GraphedCampplus(CampplusTorch):
    """`SpeakerEmbeddingBackend` (name `torch-graphs-<device>`): `CampplusTorch` replayed from device graphs.

    `runner_options` go to `DeviceGraphRunner` (`enabled`, `max_graphs`, `lazy`, `graph_api`, ...).
    """

    def __init__(self, model: CAMPPlus, device: DeviceSpec = None, **runner_options: Any) -> None:
        super().__init__(model, device, fast=True)
        self.name = f"torch-graphs-{device_key(self.device)}"
        # Every forward of the parent (`__call__`, `embed_batch`) goes through `self._impl`.
        self.runner: DeviceGraphRunner[torch.Tensor] = DeviceGraphRunner(
            self._impl, name="campplus", device=self.device, **runner_options
        )
        self._impl = self.runner  # type: ignore[assignment]

    @classmethod
    def from_onnx(
        cls,
        onnx_path: str | os.PathLike[str],
        device: DeviceSpec = None,
        *,
        seg_pool_mode: str = DEFAULT_SEG_POOL_MODE,
        **runner_options: Any,
    ) -> GraphedCampplus:
        """Load `campplus.onnx` (strict mapping, see `torch_backend`) and wrap it."""
        return cls(load_campplus_from_onnx(onnx_path, seg_pool_mode=seg_pool_mode), device, **runner_options)

    @property
    def pads_rows(self) -> bool:
        """Rows are padded to a batch bucket wherever graphs replay (they are part of the key)."""
        return self.runner.graphs_active or super().pads_rows

    def __call__(self, feat: torch.Tensor | np.ndarray) -> torch.Tensor:
        """`feat` [T, 80] -> [1, E]. With graphs active a one-row bucketed launch (the graph of
        (batch bucket 1, frame bucket of T)); eager, the exact-length call of `CampplusTorch`."""
        if not self.runner.graphs_active:
            return super().__call__(feat)
        with self._threads():
            return self._embed_prepared([self._prepare(feat)])

    def launch_inputs(self, feat: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The device-resident (features, lengths) of the one-row launch `self(feat)` runs (graphs
        active): the runner called on them replays exactly that graph, without the input checks."""
        prepared = [self._prepare(feat)]
        (launch,) = self.plan([prepared[0].shape[0]])
        return self._launch_inputs(launch, prepared)

    def warmup(self, frames: Iterable[int], batch_sizes: Iterable[int] = (1,), *, seed: int = 0) -> int:
        """Capture now the graphs that `batch_sizes` utterances of each of `frames` frames launch with
        (their (batch bucket, frame bucket) keys, see `CampplusTorch.plan`); returns how many distinct
        launch shapes have a graph.

        Example features are seeded Gaussian noise with zero mean over time (like mean-normalised
        fbank), not zeros, so the runner's verification compares meaningful values.
        """
        generator = torch.Generator().manual_seed(seed)
        ready: set[tuple[int, int]] = set()
        for rows in batch_sizes:
            for count in frames:
                if count < MIN_FRAMES:
                    raise ValueError(f"warmup frames must be >= {MIN_FRAMES}, got {count}")
                example = torch.randn(count, FEAT_DIM, generator=generator)
                example -= example.mean(dim=0, keepdim=True)
                prepared = [example.to(self.device)] * rows
                for launch in self.plan([count] * rows):
                    if (launch.rows, launch.frames) not in ready and self.runner.warmup(
                        *self._launch_inputs(launch, prepared)
                    ):
                        ready.add((launch.rows, launch.frames))
        return len(ready)

    def counters(self) -> GraphCounters:
        return self.runner.counters()

    def __repr__(self) -> str:
        return f"GraphedCampplus(name={self.name!r}, seg_pool_mode={self.seg_pool_mode!r}, runner={self.runner!r})"


__all__ = ["GraphedCampplus"]
