# SPDX-License-Identifier: Apache-2.0
"""Which of CosyVoice3's stage launches replay device graphs, and the counters the stage reports about them.

On an accelerator a CosyVoice3 streaming chunk is launch-bound: a flow launch runs `n_timesteps x
depth` DiT blocks of small kernels (22 blocks x 10 steps at full size) and a vocoder push a few
hundred convolutions. `CosyVoice3Graphs` captures both through `platforms.device_graphs.DeviceGraphRunner`
(the one capture helper), as `token2wav_core.graphs.StageGraphs` does for the other families:

| launch               | captured as                                          | key (one graph per key and runner)  |
|----------------------|------------------------------------------------------|-------------------------------------|
| flow: one DiT        | `depth + 2` segments between the conv position       | the launch's frames N (a stage      |
| evaluation per Euler | embedding and the attention calls                    | frame bucket): rows, chunk lengths  |
| step (CFG pair)      | (`layers/flow_cosyvoice3/graphed.py`)                | and history lengths do not enter it |
| vocoder: the causal  | `decode` of a steady chunk (conv_pre .. conv_post)   | (rows, chunk frames), captured at   |
| HiFT push            | (`layers/hift_causal/graphed.py`)                    | its 2nd call                        |

Eager in both: attention over each row's K/V arena and the conv position embedding with each row's
history (per row, exact), the F0 predictor (float64) and the sine source, the first and the last
chunk's decode, and the full-attention last chunk's whole-utterance re-run and whole utterances
(`whole`, sync mode), which have one-off shapes.

Switch: the stage option `token2wav_device_graphs` (None / "auto": follow `VLLM_OMNI_TOKEN2WAV_DEVICE_GRAPHS`
and the platform; False: no capture objects, the plain eager path; True: on even when the environment says
off). With graphs active the planner pads every flow launch to `buckets.stage_frame_buckets()` (a
zero pseudo-row attention never reads) so few keys cover all traffic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.flow import CausalMaskedDiffWithDiT
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.graphed import FlowGraphs
from vllm_omni_token2wav.model_executor.layers.hift_causal import CausalHiFTGenerator, CausalHiFTStreamer
from vllm_omni_token2wav.model_executor.layers.hift_causal.graphed import GraphedCausalHiFT
from vllm_omni_token2wav.platforms.device_graphs import FROM_PLATFORM, GraphCounters, GraphKey, describe_key

logger = init_logger(__name__)


@dataclass(frozen=True)
class CosyVoice3GraphSettings:
    """How the backend captures its launches: the stage's switch (None: auto) and the runner options."""

    enabled: bool | None = None
    graph_api: Any = FROM_PLATFORM
    max_graphs: int | None = None


class CosyVoice3Graphs:
    """The flow's DiT segments and the causal HiFT's decoder of one stage, each behind its graph runners."""

    def __init__(
        self,
        flow: CausalMaskedDiffWithDiT,
        hift: CausalHiFTGenerator,
        streamer: CausalHiFTStreamer,
        *,
        device: torch.device,
        settings: CosyVoice3GraphSettings,
    ) -> None:
        options: dict[str, Any] = {
            "enabled": settings.enabled,
            "graph_api": settings.graph_api,
            "max_graphs": settings.max_graphs,
        }
        self.flow = FlowGraphs(flow.estimator, device=device, **options)
        self.hift = GraphedCausalHiFT(hift, device=device, **options)
        #: the eager streamer's policy over the graphed decoder: its states are the eager streamer's
        self.streamer = self.hift.streamer(streamer.policy)
        logger.info(
            "cosyvoice3 stage graphs: %s (flow %d segments, causal HiFT decoder)",
            self.flow.runners[0].backend if self.active else "off, eager",
            len(self.flow.runners),
        )

    @property
    def active(self) -> bool:
        """Whether launches replay graphs (False: the plain eager kernels run)."""
        return self.flow.active

    def counters(self) -> list[GraphCounters]:
        return [*self.flow.counters(), self.hift.counters()]

    def keys(self) -> dict[str, list[GraphKey]]:
        """Captured keys per runner, least recently used first."""
        return {r.name: r.captured_keys() for r in (*self.flow.runners, self.hift.runner)}

    def summary(self) -> dict[str, Any]:
        """Totals for reports, with the fields of `StageGraphs.summary()` (the flow's estimator is the DiT)."""
        counters = self.counters()
        flow = counters[: len(self.flow.runners)]
        keys = self.keys()
        return {
            "backend": counters[0].backend,
            "active": self.active,
            "estimator_segments": len(flow),
            "estimator_keys": [describe_key(k) for k in keys[flow[0].name]],
            "hift_keys": [describe_key(k) for k in keys[self.hift.runner.name]],
            "graphs": sum(c.graphs for c in counters),
            "captures": sum(c.captures for c in counters),
            "replays": sum(c.replays for c in counters),
            "eager_fallbacks": sum(c.eager_fallbacks for c in counters),
            "estimator_eager_launches": self.flow.eager_launches,
            "estimator_graph_launches": self.flow.graph_launches,
            "hift_eager_decodes": self.hift.eager_decodes,
            "evictions": sum(c.evictions for c in counters),
            "failures": sum(c.failures for c in counters),
            "capture_ms": sum(c.capture_ms for c in counters),
        }

    def clear(self) -> None:
        self.flow.clear()
        self.hift.runner.clear()


__all__ = ["CosyVoice3GraphSettings", "CosyVoice3Graphs"]
