# SPDX-License-Identifier: Apache-2.0
"""The per-family kernel interface the Token2Wav stage engine drives: `Token2WavBackend`.

The step executor (`step_executor.py`) owns everything about requests: parsing, stream state, admission rules,
planning launches, isolating failures, committing. A backend owns everything about the models:
preparing a voice, a stream's caches, what a chunk's shapes are, and the batched launches. Nothing
crosses the line in the other direction: a backend never sees request ids, and the engine treats
voices and caches as opaque, immutable values it stores and hands back.

Every Token2Wav family is flow (tokens -> mel) then vocoder (mel -> audio), so a chunk is two
launches, planned separately because their batching constraints differ (the flow is ragged over
rows of any length; a vocoder launch needs equal mel lengths). The CosyVoice3 DiT flow with its
causal HiFT (`cosyvoice3/backend.py`) implements the same methods. The Protocol is generic in the
three values the engine stores for a backend without looking inside (`Token2WavBackend[VoiceT,
CachesT, FlowT]`: a prepared voice, a stream's caches, a flow launch's per-row product), so each
backend's methods take its own types and the engine, typed `Token2WavBackend[Any, Any, Any]`, cannot
mix them up:

| method                              | contract                                                       |
|-------------------------------------|----------------------------------------------------------------|
| `ensure_loaded()`                   | idempotent; builds the models (fp32 by explicit dtype)          |
| `prepare_voice(key, wav_24k)`       | a prepared voice (prompt features, post-prompt state) for a    |
|                                     | normalised 24 kHz reference (or what the engine's `load_voice` |
|                                     | returns, e.g. CosyVoice3's prompt); may be slow the first time  |
| `open_stream(voice, seed)`          | a new stream's caches                                           |
| `shape(caches, tokens, last)`       | the chunk's `ChunkShape` (host integers only); raises           |
|                                     | ValueError, naming the limit, if the chunk cannot run           |
| `run_flow(works, pad_frames)`       | one batched flow launch; one opaque product per row             |
| `run_vocoder(works, products, pad_rows)` | one batched vocoder launch; `(audio [n] float32, new caches)` per row |
| `flush(caches)`                     | the audio a 0-token last chunk releases (the held-back tail)    |
| `whole(voice, tokens, seed)`        | a whole utterance's audio (no stream)                           |
| `whole_rows(works)` (optional)      | several whole utterances (`WholeWork`) in one launch, each row  |
|                                     | equal to `whole` of it alone; without it they run one by one    |
| `stream_bytes(caches, voice)`       | memory a stream holds on its own vs. shares with its voice      |

Optional: `check_whole(voice, tokens)`, raising ValueError (naming the limit) for a whole utterance that cannot
run, called at admission so that a bad row never fails a shared `whole_rows` launch. Optional:
`estimate_stream_bytes(voice, tokens) -> int`, a stream's own bytes after `tokens` received
tokens, computed before the stream exists (the memory budget's admission estimate, `memory_budget.py`;
CosyVoice3 has it). Without it the executor uses the own bytes per token it measured on committed streams.

Launch methods may raise; the engine then re-runs the launch's rows one by one so that only the
culprit fails. They must not read tensor values on the host (no synchronisation in kernels).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import torch


@dataclass(frozen=True)
class ChunkShape:
    """What the planner needs about one chunk, from host integers, before anything runs.

    - `flow_key`: rows with equal keys may share a flow launch;
    - `flow_frames`: the row's frames on the flow launch's ragged time axis;
    - `attention_key`: rows with equal keys can share attention calls, so a launch keeps them adjacent;
    - `vocoder_key`: rows with equal keys may share a vocoder launch.
    """

    flow_key: Hashable
    flow_frames: int
    attention_key: Hashable
    vocoder_key: Hashable


#: A backend's prepared voice, a stream's caches, and a flow launch's product for one row.
VoiceT = TypeVar("VoiceT")
CachesT = TypeVar("CachesT")
FlowT = TypeVar("FlowT")


@dataclass(frozen=True)
class ChunkWork(Generic[CachesT]):
    """One row of a launch: a stream's caches, its chunk's tokens, and whether it is the last chunk."""

    caches: CachesT
    tokens: tuple[int, ...]
    last: bool


@dataclass(frozen=True)
class WholeWork(Generic[VoiceT]):
    """One row of a `whole_rows` launch: a whole utterance's prepared voice, tokens and noise seed."""

    voice: VoiceT
    tokens: tuple[int, ...]
    seed: int


@dataclass(frozen=True)
class StreamBytes:
    """Bytes a stream holds alone (`own`) and bytes it shares with other streams of its voice (`shared`)."""

    own: int
    shared: int


class Token2WavBackend(Protocol[VoiceT, CachesT, FlowT]):
    """Models of one Token2Wav family behind the engine (see the module table)."""

    name: str

    @property
    def device(self) -> torch.device: ...

    def ensure_loaded(self) -> None: ...

    def prepare_voice(self, key: str, wav_24k: Any) -> VoiceT: ...

    def open_stream(self, voice: VoiceT, seed: int) -> CachesT: ...

    def shape(self, caches: CachesT, tokens: Sequence[int], last: bool) -> ChunkShape: ...

    def run_flow(self, works: Sequence[ChunkWork[CachesT]], pad_frames: int) -> list[FlowT]: ...

    def run_vocoder(
        self, works: Sequence[ChunkWork[CachesT]], products: Sequence[FlowT], pad_rows: int
    ) -> list[tuple[torch.Tensor, CachesT]]: ...

    def flush(self, caches: CachesT) -> torch.Tensor: ...

    def whole(self, voice: VoiceT, tokens: Sequence[int], seed: int) -> torch.Tensor: ...

    def stream_bytes(self, caches: CachesT, voice: VoiceT) -> StreamBytes: ...


__all__ = ["CachesT", "ChunkShape", "ChunkWork", "FlowT", "StreamBytes", "Token2WavBackend", "VoiceT", "WholeWork"]
