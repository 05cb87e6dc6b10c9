# SPDX-License-Identifier: Apache-2.0
"""The vocoder side of streaming for many streams at once: HiFT over `[cached mel | chunk mel]`.

Per row this is the reference's per-chunk vocoder step (rules in `token2wav_stream.py`): HiFT over
the last 8 mel frames of the previous chunk followed by the new chunk, the first 3840 NSF source
samples overwritten by the previous chunk's last 3840 (phase continuity), the first 3840 output
samples cross-faded with the 3840 the previous chunk held back, and all but the last 3840 samples
emitted (everything on the last chunk).

HiFT is convolutional along time, so rows share a launch only when their mel inputs have the same
length and the same cache presence (`launch_key`); steady-state chunks (8 + 50 frames) all do. Each
row draws its NSF noise from its own generator in the order a batch-1 call draws it (per-row
generators in `hift.source.draw`), so a row's audio never depends on what shares the launch.

A request's generator is kept as data (`NoiseState`: seed + generator state bytes) so that the
whole per-stream state is immutable: a launch rebuilds each row's generator from its state, and a
row whose launch fails keeps the state it had.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from vllm_omni.model_executor.models.cosyvoice2.hift import HiFTGenerator
from vllm_omni.model_executor.models.cosyvoice2.hift.graphed import GraphedHiFT
from vllm_omni.model_executor.models.step_audio2.token2wav_stream import (
    MEL_CACHE_FRAMES,
    SOURCE_CACHE_SAMPLES,
    crossfade_rows,
)


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


@dataclass(frozen=True)
class VocoderRow:
    mel: torch.Tensor  # [1, 80, m] the chunk's mel (flow dtype; vocoded in float32)
    state: VocoderState
    last: bool


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
    """One HiFT launch over `rows` (all with the same `launch_key`); `pad_rows` zero rows are appended
    (a bucketed batch size for graph capture) and dropped. `graphed` (over the same `hift`) replays
    the HiFT network from device graphs, with the same noise and so the same audio."""
    if not rows:
        return []
    keys = {row.state.launch_key(row.mel.shape[2]) for row in rows}
    if len(keys) > 1:
        raise ValueError(f"vocode_chunks: rows of one HiFT launch must share mel length and caches, got {keys}")
    device = rows[0].state.mel.device
    mel = torch.cat([torch.cat([row.state.mel, row.mel.float()], dim=2) for row in rows], dim=0)
    sources = torch.cat([row.state.source for row in rows], dim=0)
    generators: list[torch.Generator | None] = [row.state.noise.generator(device) for row in rows]
    if pad_rows:
        mel = torch.cat([mel, mel.new_zeros(pad_rows, *mel.shape[1:])], dim=0)
        sources = torch.cat([sources, sources.new_zeros(pad_rows, *sources.shape[1:])], dim=0)
        generators += [None] * pad_rows
    cache = sources if sources.shape[2] else None
    speech, source = hift(mel, cache, generator=generators) if graphed is None else graphed(mel, cache, generators)
    speech = speech[: len(rows)].float()
    held = torch.cat([row.state.speech for row in rows], dim=0)
    if held.shape[1]:
        speech = crossfade_rows(speech, held, window)
    out = []
    for i, row in enumerate(rows):
        gen = generators[i]
        assert gen is not None
        state = VocoderState(
            mel=mel[i : i + 1, :, -MEL_CACHE_FRAMES:].clone(),
            source=source[i : i + 1, :, -SOURCE_CACHE_SAMPLES:].clone(),
            speech=speech[i : i + 1, -SOURCE_CACHE_SAMPLES:].clone(),
            noise=row.state.noise.after(gen),
        )
        emitted = speech[i : i + 1] if row.last else speech[i : i + 1, :-SOURCE_CACHE_SAMPLES]
        out.append(VocodedChunk(speech=emitted, state=state))
    return out


__all__ = ["NoiseState", "VocodedChunk", "VocoderRow", "VocoderState", "vocode_chunks"]
