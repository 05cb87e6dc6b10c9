# SPDX-License-Identifier: Apache-2.0
"""The vocoder side of a Token2Wav stream behind one Protocol, and the choice of vocoder in one table.

The flow model streams the same way for every CosyVoice2-flow family; what turns a chunk's mel
into audio differs. The core facade (`StepAudio2Token2WavCore`), its `stream()` and the serving
stage's backend (`token2wav_core.stage_backend`) only talk to a `StreamVocoder`:

| `VocoderKind` | files                 | streaming                           | whole utterance    | MiniCPM-o as     |
|---------------|-----------------------|-------------------------------------|--------------------|------------------|
| `HIFT`        | `hift.pt`             | HiFT over 8 cached + new frames,    | `hift.pt`          | vLLM-Omni 0.30   |
|               |                       | Hamming cross-fade                  |                    | (and Step-Audio2)|
|               |                       | (`cosyvoice2.hift.batched`)        |                    |                  |
| `CAUSAL_HIFT` | `config.yaml` +       | bounded causal HiFT, 3840 leading   | `hift_original.pt` | minicpmo-utils   |
|               | causal `hift.pt`      | zeros, no cross-fade                | (non-causal HiFT)  | 1.0.7            |
|               |                       | (`causal_vocoder`)                  |                    |                  |

A stream's vocoder state is immutable data (`VocoderState` / `CausalHiFTStreamState`); `vocode`
returns new states and never modifies the ones it got, so a failed launch leaves every stream as
it was. Rows share a launch when their `launch_key`s agree (the planner groups them).
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from typing import Protocol

import torch

from vllm_omni_token2wav.model_executor.layers.hift import HiFTGenerator
from vllm_omni_token2wav.model_executor.layers.hift.batched import (
    NoiseState,
    VocoderChunk,
    VocoderState,
    vocode_chunks,
)
from vllm_omni_token2wav.model_executor.layers.hift.crossfade import MEL_CACHE_FRAMES
from vllm_omni_token2wav.model_executor.layers.hift.graphed import GraphedHiFT
from vllm_omni_token2wav.model_executor.models.token2wav_core.prompt_features import MEL_BINS


class VocoderKind(str, enum.Enum):
    """Which vocoder a token2wav directory streams with (see the module table)."""

    HIFT = "hift"
    CAUSAL_HIFT = "causal_hift"


class StreamVocoder(Protocol):
    """Mel chunks of many streams -> audio, with each stream's state kept as immutable data."""

    name: str
    #: Mel frames a non-final chunk must bring (the cross-fade vocoder re-vocodes 8 of them).
    min_chunk_frames: int
    #: The HiFT network a stage may replay from device graphs (`hift.graphed.GraphedHiFT`); None: eager only.
    hift: HiFTGenerator | None

    def start(self, seed: int, device: torch.device) -> object:
        """The vocoder state of a new stream (`seed`: its noise, where the vocoder draws any)."""
        ...

    def launch_key(self, state: object, frames: int, last: bool, *, equal_shapes: bool = False) -> Hashable:
        """Chunks whose keys agree may share one `vocode` launch.

        `equal_shapes`: the caller wants launches of one shape only (a captured graph replays one shape);
        otherwise a vocoder whose eager launch pads and masks rows of different lengths may key them alike.
        """
        ...

    def vocode(
        self, chunks: Sequence[VocoderChunk], pad_rows: int = 0, graphed: GraphedHiFT | None = None
    ) -> list[tuple[torch.Tensor, object]]:
        """One launch over `chunks` (equal `launch_key`s): (new audio `[1, n]` float32, next state) per chunk.

        `pad_rows` extra rows (a bucketed batch size for graph capture) run and are dropped; `graphed`
        (over `self.hift`, only where it is not None) replays the network from device graphs.
        """
        ...

    def flush(self, state: object) -> torch.Tensor:
        """The audio `[1, n]` a 0-token last chunk releases (what the stream still holds back)."""
        ...


class CrossfadeHiFTVocoder:
    """`VocoderKind.HIFT`: the non-causal HiFT re-vocoding 8 cached frames, Hamming cross-fade (per-row noise)."""

    name = "hift-crossfade"
    min_chunk_frames = MEL_CACHE_FRAMES

    def __init__(self, hift: HiFTGenerator, window: torch.Tensor) -> None:
        self.hift = hift
        self.window = window

    def start(self, seed: int, device: torch.device) -> VocoderState:
        return VocoderState.start(MEL_BINS, device, NoiseState(int(seed)))

    def launch_key(self, state: object, frames: int, last: bool, *, equal_shapes: bool = False) -> Hashable:
        assert isinstance(state, VocoderState)
        # Eager `vocode_chunks` runs rows of any mel length and cache presence in one padded, masked launch.
        return state.launch_key(frames) if equal_shapes else self.name

    def vocode(
        self, chunks: Sequence[VocoderChunk[VocoderState]], pad_rows: int = 0, graphed: GraphedHiFT | None = None
    ) -> list[tuple[torch.Tensor, object]]:
        outs = vocode_chunks(self.hift, chunks, self.window, pad_rows=pad_rows, graphed=graphed)
        return [(out.speech, out.state) for out in outs]

    def flush(self, state: object) -> torch.Tensor:
        assert isinstance(state, VocoderState)
        return state.speech


__all__ = ["CrossfadeHiFTVocoder", "StreamVocoder", "VocoderChunk", "VocoderKind"]
