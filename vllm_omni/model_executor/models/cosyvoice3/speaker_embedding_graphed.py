# SPDX-License-Identifier: Apache-2.0
"""CAM++ replayed from device graphs: the torch speaker embedding without per-kernel launch cost.

On an accelerator the folded CAM++ (`campplus.inference`) is launch-bound: a call is a few hundred
small kernels (~11 MFLOP per frame, microseconds of H200 compute at T=200), so eager latency is the
launch overhead. `GraphedCampplus` is `CampplusTorch` with its forward routed through
`platforms.device_graphs.DeviceGraphRunner`: one CUDA / NPU graph per input shape, captured on the
first call of that shape (or at `warmup()`), replayed afterwards; eager where the platform has no
graphs (CPU) or graphs are switched off (`VLLM_OMNI_DEVICE_GRAPHS=0`).

Keys are shapes. The inherited `embed_batch` hands the runner padded launches plus their lengths
(`CampplusInference(x, lengths)`: frames padded to `buckets.campplus_frame_buckets()`, rows to
`buckets.batch_buckets()` off the CPU, masked exactly), so batched calls are keyed by (batch bucket,
frame bucket) and a few dozen graphs cover every prompt; the inherited `__call__` still runs one
utterance at its exact length (one graph per distinct length, LRU-evicted beyond the runner's cap).
This is the thin adapter the device check uses.

Numerics are those of `CampplusTorch` (the graph replays the same kernels; the runner verifies the
first replay of each graph against an eager run).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch

from vllm_omni.model_executor.models.campplus.dtdnn import CAMPPlus
from vllm_omni.model_executor.models.cosyvoice3.speaker_embedding_torch import (
    DEFAULT_SEG_POOL_MODE,
    FEAT_DIM,
    MIN_FRAMES,
    CampplusTorch,
    load_campplus_from_onnx,
)
from vllm_omni.platforms.device import DeviceSpec, device_key
from vllm_omni.platforms.device_graphs import DeviceGraphRunner, GraphCounters


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
        """Load `campplus.onnx` (strict mapping, see `speaker_embedding_torch`) and wrap it."""
        return cls(load_campplus_from_onnx(onnx_path, seg_pool_mode=seg_pool_mode), device, **runner_options)

    def warmup(self, frames: Iterable[int], batch_sizes: Iterable[int] = (1,), *, seed: int = 0) -> int:
        """Capture the graphs of every (batch, frames) pair now; returns how many keys have a graph.

        Example features are seeded Gaussian noise with zero mean over time (like mean-normalised
        fbank), not zeros, so the runner's verification compares meaningful values.
        """
        generator = torch.Generator().manual_seed(seed)
        ready = 0
        for rows in batch_sizes:
            for count in frames:
                if count < MIN_FRAMES:
                    raise ValueError(f"warmup frames must be >= {MIN_FRAMES}, got {count}")
                example = torch.randn(rows, count, FEAT_DIM, generator=generator)
                example -= example.mean(dim=1, keepdim=True)
                ready += bool(self.runner.warmup(example.to(self.device)))
        return ready

    def counters(self) -> GraphCounters:
        return self.runner.counters()

    def __repr__(self) -> str:
        return f"GraphedCampplus(name={self.name!r}, seg_pool_mode={self.seg_pool_mode!r}, runner={self.runner!r})"


__all__ = ["GraphedCampplus"]
