# SPDX-License-Identifier: Apache-2.0
"""HiFT's batched streaming call with its network replayed from device graphs.

A HiFT chunk call is a few hundred small kernels (F0 predictor, sine source, the up-sampling
stack with its residual blocks, the source branch, the iSTFT), launch-bound on an accelerator at
streaming sizes. One part of `HiFTGenerator.forward` cannot be inside a captured graph: the NSF
noise. Each row draws from its own `torch.Generator` (per-request noise, see `source.py`), and a
replay cannot advance generators, so `draw_ahead` draws every row's noise before the call, in the
batch-1 order, and the captured call reads it (`source.DrawnNoise`). (The iSTFT is
`layers.centred_istft`, torch's istft without its host-side window check, so it is captured too.)

So `GraphedHiFT(mel, cache_source, generators)` = eager noise draws, then one replay of
`excitation` + `decode` keyed by (rows, mel frames, cached source samples): the same ops on the
same values as `hift(mel, cache_source, generator=generators)`, hence the same audio. Keys come
from the stage's vocoder launches: steady-state chunks (8 + 50 frames, 3840
cached samples) at each batch bucket, first chunks (50 frames, none cached), and last chunks of
every length; `capture_after=2` (default) keeps a last-chunk length seen once from costing a
capture.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vllm_omni_token2wav.model_executor.layers.hift.generator import HiFTGenerator
from vllm_omni_token2wav.model_executor.layers.hift.source import DrawnNoise, draw_ahead
from vllm_omni_token2wav.platforms.device import DeviceSpec
from vllm_omni_token2wav.platforms.device_graphs import FROM_PLATFORM, DeviceGraphRunner, GraphCounters
from vllm_omni_token2wav.platforms.graph_api import DeviceGraphApi

#: Default calls of a shape before it is captured (a stream's odd last-chunk length occurs once).
DEFAULT_CAPTURE_AFTER = 2


class GraphedHiFT:
    """`HiFTGenerator` with per-row generators, its network replayed from device graphs (module docstring).

    Runner options (`enabled`, `max_graphs`, `capture_after`, ...) go to the `DeviceGraphRunner`
    named `hift`; `graph_api` defaults to the serving platform's (tests pass a fake).
    """

    def __init__(
        self,
        hift: HiFTGenerator,
        *,
        device: DeviceSpec = None,
        graph_api: DeviceGraphApi | Any = FROM_PLATFORM,
        **runner_options: Any,
    ) -> None:
        self.hift = hift
        self.noise_dtype = next(hift.f0_predictor.parameters()).dtype  # SineGen draws in F0's dtype
        runner_options.setdefault("capture_after", DEFAULT_CAPTURE_AFTER)
        self.runner: DeviceGraphRunner[tuple[torch.Tensor, torch.Tensor]] = DeviceGraphRunner(
            self._network, name="hift", device=device, graph_api=graph_api, **runner_options
        )

    def _network(
        self, mel: torch.Tensor, cache_source: torch.Tensor, initial_phase: torch.Tensor, harmonics: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(speech, source): `hift.forward` on noise drawn ahead."""
        return self.hift(mel, cache_source, generator=DrawnNoise(initial_phase, harmonics))

    def __call__(
        self, mel: torch.Tensor, cache_source: torch.Tensor | None, generators: Sequence[torch.Generator | None]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(speech [B, 480 T], source [B, 1, 480 T]) of `mel` [B, 80, T]; `None` generators are padding rows."""
        self.hift.check_mel(mel)
        if len(generators) != mel.shape[0]:
            raise ValueError(f"GraphedHiFT: {len(generators)} generators for a batch of {mel.shape[0]} rows")
        samples = mel.shape[-1] * self.hift.config.upsample_scale
        noise = draw_ahead(
            generators, samples, self.hift.config.nb_harmonics + 1, device=mel.device, dtype=self.noise_dtype
        )
        cache = cache_source if cache_source is not None else mel.new_zeros((mel.shape[0], 1, 0))
        return self.runner(mel, cache, noise.initial_phase, noise.harmonics)

    def counters(self) -> GraphCounters:
        return self.runner.counters()


__all__ = ["DEFAULT_CAPTURE_AFTER", "GraphedHiFT"]
