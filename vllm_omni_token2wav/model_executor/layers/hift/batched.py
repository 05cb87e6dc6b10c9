# SPDX-License-Identifier: Apache-2.0
"""The vocoder side of streaming for many streams at once: HiFT over `[cached mel | chunk mel]`.

Per row this is the reference's per-chunk vocoder step (rules in `token2wav_core/stream.py`): HiFT over
the last 8 mel frames of the previous chunk followed by the new chunk, the first 3840 NSF source
samples overwritten by the previous chunk's last 3840 (phase continuity), the first 3840 output
samples cross-faded with the 3840 the previous chunk held back, and all but the last 3840 samples
emitted (everything on the last chunk).

Rows of any mel length and cache presence share one launch (`HiFTGenerator.vocode_rows`): F0, the
NSF source, STFT and iSTFT per row on the row's own frames, the convolution stack once over the rows
right-padded to the longest with per-stage length masks, so first chunks (50 frames, no caches),
steady chunks (8 + 50) and last chunks of every length are one launch. `launch_key` still names
rows of identical shapes, for launches that must have one shape (graph capture). Each row draws its
NSF noise from its own generator in the order a batch-1 call draws it (per-row generators in
`hift.source.draw`), so a row's audio never depends on what shares the launch.

A request's generator is kept as data (`NoiseState`: seed + generator state bytes) so that the
whole per-stream state is immutable: a launch rebuilds each row's generator from its state, and a
row whose launch fails keeps the state it had.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from vllm_omni_token2wav.model_executor.layers.hift import HiFTGenerator
from vllm_omni_token2wav.model_executor.layers.hift.crossfade import (
    MEL_CACHE_FRAMES,
    SOURCE_CACHE_SAMPLES,
    crossfade_rows,
)
from vllm_omni_token2wav.model_executor.layers.hift.graphed import GraphedHiFT


@dataclass(frozen=True)
class NoiseState:
    """A request's NSF-noise generator as data: its seed and, after the first chunk, the generator state."""

    seed: int
    state: torch.Tensor | None = None  # `torch.Generator.get_state()` (CPU uint8 tensor)

    def generator(self, device: torch.device) -> torch.Generator:
        gen = torch.Generator(device=device)
        if self.state is None:
            gen.manual_seed(self.seed)
        else:
            gen.set_state(self.state)
        return gen

    def after(self, generator: torch.Generator) -> NoiseState:
        return NoiseState(self.seed, generator.get_state())


@dataclass(frozen=True)
class VocoderState:
    """What the next chunk's vocoder step needs from the previous one (all empty before the first chunk)."""

    mel: torch.Tensor  # [1, 80, <= 8] last mel frames
    source: torch.Tensor  # [1, 1, <= 3840] last NSF source samples
    speech: torch.Tensor  # [1, <= 3840] held-back samples for the cross-fade
    noise: NoiseState

    @classmethod
    def start(cls, mel_bins: int, device: torch.device, noise: NoiseState) -> VocoderState:
        f32 = torch.float32
        return cls(
            mel=torch.zeros(1, mel_bins, 0, device=device, dtype=f32),
            source=torch.zeros(1, 1, 0, device=device, dtype=f32),
            speech=torch.zeros(1, 0, device=device, dtype=f32),
            noise=noise,
        )

    def launch_key(self, chunk_frames: int) -> Hashable:
        """Rows may share a HiFT launch when these agree: total mel frames and the cached lengths."""
        return (self.mel.shape[2] + chunk_frames, self.source.shape[2], self.speech.shape[1], self.mel.device)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.mel, self.source, self.speech, self.noise.state) if t is not None]


#: A vocoder's per-stream state type (`VocoderState` here; the causal HiFT's stream state elsewhere).
StateT = TypeVar("StateT")


@dataclass(frozen=True)
class VocoderChunk(Generic[StateT]):
    """One stream's chunk for a vocoder: its new mel `[1, 80, m]` (flow dtype), its state, whether it is the last.

    The one record of the flow -> vocoder hop: the stage backend and the facade build it, every
    `StreamVocoder` takes it, and this module's kernel runs it as a row (`VocoderRow`) unchanged.
    """

    mel: torch.Tensor
    state: StateT
    last: bool


#: A row of `vocode_chunks`: a chunk whose state is this HiFT's `VocoderState`.
VocoderRow = VocoderChunk[VocoderState]


@dataclass(frozen=True)
class VocodedChunk:
    speech: torch.Tensor  # [1, n] float32: the samples this chunk emits
    state: VocoderState


@torch.inference_mode()
def vocode_chunks(
    hift: HiFTGenerator,
    rows: Sequence[VocoderRow],
    window: torch.Tensor,
    *,
    pad_rows: int = 0,
    graphed: GraphedHiFT | None = None,
) -> list[VocodedChunk]:
    """One HiFT launch over `rows`; `pad_rows` zero rows are appended (a bucketed batch size) and dropped.

    Eager (`graphed` None): rows of any mel lengths and caches (`HiFTGenerator.vocode_rows`).
    `graphed` (a `GraphedHiFT` over the same `hift`) replays the HiFT network from device graphs:
    one shape per launch, so the rows must share `launch_key`; same noise, hence the same audio.
    """
    if not rows:
        return []
    device = rows[0].state.mel.device
    mels = [torch.cat([row.state.mel, row.mel.float()], dim=2) for row in rows]
    generators = [row.state.noise.generator(device) for row in rows]
    if graphed is None:
        speech, sources = hift.vocode_rows(mels, [row.state.source for row in rows], generators, pad_rows=pad_rows)
    else:
        speech, sources = _vocode_graphed(graphed, rows, mels, generators, pad_rows)
    scale = hift.config.upsample_scale
    out = []
    for i, row in enumerate(rows):
        own = speech[i : i + 1, : mels[i].shape[2] * scale].float()
        if row.state.speech.shape[1]:
            own = crossfade_rows(own, row.state.speech, window)
        state = VocoderState(
            mel=mels[i][:, :, -MEL_CACHE_FRAMES:].clone(),
            source=sources[i][:, :, -SOURCE_CACHE_SAMPLES:].clone(),
            speech=own[:, -SOURCE_CACHE_SAMPLES:].clone(),
            noise=row.state.noise.after(generators[i]),
        )
        out.append(VocodedChunk(speech=own if row.last else own[:, :-SOURCE_CACHE_SAMPLES], state=state))
    return out


def _vocode_graphed(
    graphed: GraphedHiFT,
    rows: Sequence[VocoderRow],
    mels: list[torch.Tensor],
    generators: list[torch.Generator],
    pad_rows: int,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """`vocode_rows`' (speech, per-row sources) from one replayed launch of equal-shape rows."""
    keys = {row.state.launch_key(row.mel.shape[2]) for row in rows}
    if len(keys) > 1:
        raise ValueError(f"vocode_chunks: rows of one graphed HiFT launch must share mel length and caches, got {keys}")
    mel = torch.cat(mels, dim=0)
    cache = torch.cat([row.state.source for row in rows], dim=0)
    padded: list[torch.Generator | None] = [*generators, *([None] * pad_rows)]
    if pad_rows:
        mel = torch.cat([mel, mel.new_zeros(pad_rows, *mel.shape[1:])], dim=0)
        cache = torch.cat([cache, cache.new_zeros(pad_rows, *cache.shape[1:])], dim=0)
    speech, source = graphed(mel, cache if cache.shape[2] else None, padded)
    return speech, [source[i : i + 1] for i in range(len(rows))]


__all__ = ["NoiseState", "VocodedChunk", "VocoderChunk", "VocoderRow", "VocoderState", "vocode_chunks"]
