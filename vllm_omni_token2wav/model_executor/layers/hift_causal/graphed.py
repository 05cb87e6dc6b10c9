# SPDX-License-Identifier: Apache-2.0
"""The causal HiFT's streaming chunk with its decoder replayed from device graphs.

A causal-HiFT push (`stream.CausalHiFTStreamer._step`) is three parts: the F0 predictor (float64,
possibly pinned to the CPU on NPU hosts: `place_f0_predictor`) and the sine source with the noise
table read at the stream's absolute sample, the excitation's STFT, then `decode`: conv_pre, three
up-sampling stages with their source branches and ResBlocks, conv_post. `decode` is most of the
push's kernels (every conv of the network but the F0 predictor's) and is a pure function of
tensors: the mel window, the source STFT frames and every decoder conv's left context (the
`ContextCarry` entries), returning the conv_post frames and the next contexts. So it is what is
captured; F0, source, noise cursor and the emitted-sample bookkeeping stay eager (they hold Python
counters and per-row float64 state, and are a few small kernels).

`GraphedCausalHiFT` stands in for the `CausalHiFTGenerator` inside a streamer: every attribute is
the model's (so its `StreamLayout`, and hence its states, are the eager streamer's), only `decode`
of a steady chunk (not the first of a stream, whose reflection pad and zero contexts differ, and
not a final one) goes through the runner `cosyvoice3-hift.decode`, keyed by the shapes of (mel
window, STFT frames, contexts): one key per (rows, chunk frames), the same for every chunk of a
steady stream. Replays run the same ops on the same shapes as the eager decode, hence the same
audio. `capture_after=2` (default) keeps a shape seen once (a short last-but-one chunk) from costing
a capture. Outputs are cloned out of the runner (`clone_outputs`): the contexts live on in the
stream's state.

Cost of the cut: besides the one replay, a push copies every decoder conv's context into the runner's
static inputs and clones the next ones out (about 80 small tensors each way at the shipped layout), so
on a device a push is one replay plus ~160 small copies instead of ~400 eager kernels; a packed context
layout (one tensor per stream) would remove most of those copies (not done).
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_omni_token2wav.model_executor.layers.hift.causal_conv import CausalConv1d, ContextCarry
from vllm_omni_token2wav.model_executor.layers.hift_causal.generator import CausalHiFTGenerator
from vllm_omni_token2wav.model_executor.layers.hift_causal.stream import (
    COSYVOICE3_STREAM,
    CausalHiFTStreamer,
    StreamPolicy,
)
from vllm_omni_token2wav.platforms.device import DeviceSpec
from vllm_omni_token2wav.platforms.device_graphs import FROM_PLATFORM, DeviceGraphRunner, GraphCounters
from vllm_omni_token2wav.platforms.graph_api import DeviceGraphApi

#: Default calls of a shape before it is captured (a stream's odd chunk length occurs once).
DEFAULT_CAPTURE_AFTER = 2
RUNNER_NAME = "cosyvoice3-hift.decode"


def decoder_carry_keys(model: CausalHiFTGenerator) -> list[str]:
    """The `carry_key` of every causal conv `decode` runs (all but the F0 predictor's), in module order."""
    return [
        module.carry_key
        for name, module in model.named_modules()
        if isinstance(module, CausalConv1d) and not name.startswith("f0_predictor")
    ]


class GraphedCausalHiFT:
    """A `CausalHiFTGenerator` whose steady-chunk `decode` replays device graphs (module docstring).

    Runner options (`enabled`, `max_graphs`, `capture_after`, ...) go to the `DeviceGraphRunner`;
    `graph_api` defaults to the serving platform's (tests pass a fake). `streamer(policy)` is the
    streamer that drives it; its states are interchangeable with the eager streamer's.
    """

    def __init__(
        self,
        model: CausalHiFTGenerator,
        *,
        device: DeviceSpec = None,
        graph_api: DeviceGraphApi | Any = FROM_PLATFORM,
        **runner_options: Any,
    ) -> None:
        self.model = model
        self.keys = decoder_carry_keys(model)
        runner_options.setdefault("capture_after", DEFAULT_CAPTURE_AFTER)
        self.runner: DeviceGraphRunner[tuple[torch.Tensor, ...]] = DeviceGraphRunner(
            self._decode, name=RUNNER_NAME, device=device, graph_api=graph_api, **runner_options
        )
        self.eager_decodes = 0  # first / final chunks (and any with a missing context): the eager decode

    def __getattr__(self, name: str) -> Any:
        # Everything but `decode` is the model's (config, noise, m_source, stft_window, predict_f0, ...).
        return getattr(self.model, name)

    @property
    def active(self) -> bool:
        return self.runner.graphs_active

    def streamer(self, policy: StreamPolicy = COSYVOICE3_STREAM) -> CausalHiFTStreamer:
        return CausalHiFTStreamer(self, policy)  # type: ignore[arg-type]

    def _decode(
        self, mel: torch.Tensor, source_stft: torch.Tensor, *contexts: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """(conv_post frames, *next contexts in `keys` order) of a steady, non-final chunk."""
        carry = ContextCarry(dict(zip(self.keys, contexts, strict=True)))
        post = self.model.decode(mel, source_stft, carry, first=False, finalize=False)
        following = carry.contexts()
        return (post, *(following[key] for key in self.keys))

    def decode(
        self,
        mel: torch.Tensor,
        source_stft: torch.Tensor,
        carry: ContextCarry | None,
        *,
        first: bool,
        finalize: bool,
    ) -> torch.Tensor:
        """`CausalHiFTGenerator.decode`, replayed for steady chunks (same arguments, same values)."""
        previous = [None if carry is None else carry.take(key) for key in self.keys]
        if first or finalize or carry is None or not self.active or any(p is None for p in previous):
            self.eager_decodes += 1
            return self.model.decode(mel, source_stft, carry, first=first, finalize=finalize)
        post, *following = self.runner(mel, source_stft, *previous)  # type: ignore[arg-type]
        for key, value in zip(self.keys, following, strict=True):
            carry.keep_owned(key, value)  # the runner's outputs are cloned already (`clone_outputs`)
        return post

    def counters(self) -> GraphCounters:
        return self.runner.counters()


__all__ = ["DEFAULT_CAPTURE_AFTER", "RUNNER_NAME", "GraphedCausalHiFT", "decoder_carry_keys"]
