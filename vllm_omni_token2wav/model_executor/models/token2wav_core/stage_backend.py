# SPDX-License-Identifier: Apache-2.0
"""`Token2WavBackend` of the CosyVoice2 flow + HiFT families (MiniCPM-o 4.5, Step-Audio2).

The models, prompt features and caches all come from `Token2WavCore`: a voice is the
core's content-cached `PromptFeatures` of the normalised reference plus the core's shared
post-prompt flow state (`stream_setup`); a stream's caches are the facade's `StreamCaches`; the
launches are the batched kernels `cosyvoice2.flow.batched.flow_chunks` and the core's
`StreamVocoder.vocode` (HiFT with a cross-fade, or MiniCPM-o 1.0.7's causal HiFT), the same ones the
core's own `stream()` runs with one row. So the stage, the facade and the CLI share one streaming
implementation. With `graphs` (a `GraphSettings`), the launches replay the estimator segments and
the cross-fade vocoder's HiFT from device graphs (`graphs.StageGraphs`, built when the models are);
the causal vocoder runs eagerly.

Chunk limits checked before launch (`shape`): token ids in [0, 6561); a non-final chunk emits at
least 4 tokens (the HiFT vocoder re-uses 8 mel frames; 2 with the causal one) after its 3
lookahead tokens, a final one at least 1; the conformer positional table and the noise buffer hold
the row (`batched.check_chunk`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vllm_omni_token2wav.model_executor.layers.flow.batched import (
    FlowChunkOut,
    FlowChunkRow,
    FlowRowState,
    check_chunk,
    emitted_tokens,
    flow_chunks,
)
from vllm_omni_token2wav.model_executor.layers.flow.streaming import ConformerTrim
from vllm_omni_token2wav.model_executor.models.token2wav_core.core import SPEECH_VOCAB_SIZE, Token2WavCore
from vllm_omni_token2wav.model_executor.models.token2wav_core.graphs import StageGraphs
from vllm_omni_token2wav.model_executor.models.token2wav_core.prompt_features import TOKEN_MEL_RATIO, PromptFeatures
from vllm_omni_token2wav.model_executor.models.token2wav_core.stream_vocoder import VocoderChunk
from vllm_omni_token2wav.model_executor.models.token2wav_core.synthesis import (
    StreamCaches,
    Utterance,
    open_stream,
    speech_token_tensor,
    synthesize_utterance,
    synthesize_utterances,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.backend import (
    ChunkShape,
    ChunkWork,
    StreamBytes,
    WholeWork,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.voice import VOICE_SAMPLE_RATE
from vllm_omni_token2wav.platforms.device_graphs import FROM_PLATFORM

#: A bound on what a stream's vocoder keeps between chunks (HiFT: an 8-frame mel tail, two 3840-sample
#: buffers and its noise generator's state, 38,336 bytes measured on CPU); small beside the flow's caches.
VOCODER_STATE_BYTES = 64 * 1024


@dataclass(frozen=True)
class GraphSettings:
    """How the backend captures its launches (`graphs.StageGraphs`): the stage's switch and row count."""

    max_rows: int
    enabled: bool | None = None  # None: follow VLLM_OMNI_TOKEN2WAV_DEVICE_GRAPHS and the platform
    graph_api: Any = FROM_PLATFORM
    max_graphs: int | None = None


@dataclass(frozen=True)
class CosyVoice2Voice:
    """A prepared voice: its prompt features and the flow state right after its prompt (both shared, read-only)."""

    key: str
    features: PromptFeatures
    setup: FlowRowState


class CosyVoice2Backend:
    """Flow + HiFT over a `Token2WavCore` (see the module docstring).

    `equal_vocoder_shapes` (and replaying graphs, `graphs_active`): vocoder launches hold only rows
    of one mel length and cache presence (a captured graph has one shape per launch); otherwise every
    chunk of a step shares one HiFT launch (`vocode_chunks` pads and masks rows of different lengths).
    """

    name = "cosyvoice2-flow-hift"

    def __init__(
        self, core: Token2WavCore, graphs: GraphSettings | None = None, *, equal_vocoder_shapes: bool = False
    ) -> None:
        self.core = core
        self.graph_settings = graphs
        self.graphs: StageGraphs | None = None
        self.use_graphs = True  # a run-time switch over built graphs (benchmarks compare on / off)
        self.equal_vocoder_shapes = equal_vocoder_shapes

    @property
    def device(self) -> torch.device:
        return self.core.device

    def ensure_loaded(self) -> None:
        self.core.load_models()
        settings = self.graph_settings
        if settings is not None and self.graphs is None:
            self.graphs = StageGraphs(
                self.core.flow,
                self.core.stream_vocoder.hift,  # None for the causal vocoder (and no whole-utterance HiFT loaded)
                max_rows=settings.max_rows,
                device=self.device,
                enabled=settings.enabled,
                graph_api=settings.graph_api,
                max_graphs=settings.max_graphs,
            )

    @property
    def graphs_active(self) -> bool:
        """Whether launches replay device graphs (they then want bucketed shapes from the planner)."""
        return self.use_graphs and self.graphs is not None and self.graphs.active

    # ---- voices and streams -------------------------------------------------------------------

    def prepare_voice(self, key: str, wav_24k: np.ndarray) -> CosyVoice2Voice:
        features = self.core.prepare_prompt((wav_24k, VOICE_SAMPLE_RATE), with_tokens=True)
        return CosyVoice2Voice(key=key, features=features, setup=self.core.stream_setup(features))

    def open_stream(self, voice: CosyVoice2Voice, seed: int) -> StreamCaches:
        return open_stream(self.core.flow, voice.setup, voice.features, seed, self.core.stream_vocoder)

    def shape(self, caches: StreamCaches, tokens: Sequence[int], last: bool) -> ChunkShape:
        flow, vocoder = self.core.flow, self.core.stream_vocoder
        lookahead = flow.pre_lookahead_len
        emitted = emitted_tokens(len(tokens), last, lookahead)
        min_tokens = -(-vocoder.min_chunk_frames // TOKEN_MEL_RATIO)
        if not last and emitted < min_tokens:
            raise ValueError(
                f"{len(tokens)} tokens: a non-final chunk needs at least {min_tokens} tokens "
                f"plus {lookahead} lookahead tokens (the vocoder keeps {vocoder.min_chunk_frames} mel frames)"
            )
        check_chunk(flow, caches.flow, tokens, last)
        frames = TOKEN_MEL_RATIO * emitted
        return ChunkShape(
            flow_key=caches.flow.launch_key,
            flow_frames=frames,
            attention_key=(frames, caches.flow.estimator_frames, caches.flow.conformer_frames),
            vocoder_key=vocoder.launch_key(
                caches.vocoder, frames, last, equal_shapes=self.equal_vocoder_shapes or self.graphs_active
            ),
        )

    # ---- launches -----------------------------------------------------------------------------

    def run_flow(self, works: Sequence[ChunkWork[StreamCaches]], pad_frames: int) -> list[FlowChunkOut]:
        device = self.device
        rows = []
        for work in works:
            tokens = torch.tensor(work.tokens, dtype=torch.long).to(device, non_blocking=True)
            rows.append(FlowChunkRow(tokens, work.caches.flow, work.last))
        # Inactive graphs (CPU, switched off): the plain kernels, without the fixed-shape padding.
        graphs = self.graphs.estimator if self.graphs_active and self.graphs is not None else None
        return flow_chunks(self.core.flow, rows, pad_frames=pad_frames, graphs=graphs)

    def run_vocoder(
        self, works: Sequence[ChunkWork[StreamCaches]], products: Sequence[FlowChunkOut], pad_rows: int
    ) -> list[tuple[torch.Tensor, StreamCaches]]:
        chunks = []
        for work, product in zip(works, products, strict=True):
            chunks.append(VocoderChunk(product.mel, work.caches.vocoder, work.last))
        graphed = self.graphs.hift if self.graphs_active and self.graphs is not None else None
        outs = self.core.stream_vocoder.vocode(chunks, pad_rows=pad_rows, graphed=graphed)
        return [
            (speech.reshape(-1), StreamCaches(flow=product.state, vocoder=state))  # type: ignore[attr-defined, arg-type]
            for (speech, state), product in zip(outs, products, strict=True)
        ]

    def flush(self, caches: StreamCaches) -> torch.Tensor:
        """A 0-token last chunk: what the stream still holds back (the cross-fade tail, or the causal
        vocoder's last frames)."""
        return self.core.stream_vocoder.flush(caches.vocoder).reshape(-1)

    def whole(self, voice: CosyVoice2Voice, tokens: Sequence[int], seed: int) -> torch.Tensor:
        core = self.core
        ids = core.speech_token_ids(list(tokens), "token2wav")
        generator = torch.Generator(device=core.device).manual_seed(int(seed))
        audio = synthesize_utterance(
            core.flow, core.hift, voice.features, ids, n_timesteps=core.n_timesteps, generator=generator
        )
        return audio.reshape(-1)

    def check_whole(self, voice: CosyVoice2Voice, tokens: Sequence[int]) -> None:
        """Before any launch: ids in [0, 6561) (ValueError naming the first bad one), checked on the host."""
        speech_token_tensor(list(tokens), SPEECH_VOCAB_SIZE, torch.device("cpu"), what="token2wav")

    def whole_rows(self, works: Sequence[WholeWork[CosyVoice2Voice]]) -> list[torch.Tensor]:
        """Several whole utterances (Step-Audio2's sync path), the flow's CFM in one launch, each equal to `whole`."""
        core = self.core
        rows = [
            Utterance(
                w.voice.features,
                core.speech_token_ids(list(w.tokens), "token2wav"),
                torch.Generator(device=core.device).manual_seed(int(w.seed)),
            )
            for w in works
        ]
        audio = synthesize_utterances(core.flow, core.hift, rows, n_timesteps=core.n_timesteps)
        return [a.reshape(-1) for a in audio]

    # ---- memory -----------------------------------------------------------------------------------

    def estimate_stream_bytes(self, voice: CosyVoice2Voice, tokens: int) -> int:
        """The most a stream of `voice` will own, whatever its length (the memory budget's admission estimate).

        After every chunk the caches are trimmed to `P + tail` mel frames (P = the prompt's frames, tail =
        100): the estimator's K/V keeps `max(P, tail)` frames of its own beside the voice's shared base, the
        conformer's attention cache all `P + tail` (its own copy), plus the two conv caches and the
        vocoder's state (`VOCODER_STATE_BYTES`, a bound). A stream reaches that bound after about
        `max(P, tail) / 2` tokens, so it is reserved in full at admission whatever `tokens` is, and an
        admitted stream never grows past its reservation. Pinned against `stream_bytes` on the stand-in
        (tests/model_executor/models/token2wav_stage/test_memory_budget.py): 728,000 held vs 755,200 reserved.
        Step-Audio2 (`ConformerTrim.NONE`) is the exception: its conformer cache keeps every frame, so its
        estimate grows by that cache's bytes for `TOKEN_MEL_RATIO` frames per token (checked after every chunk
        by the memory budget like CosyVoice3's).
        """
        setup = voice.setup
        prompt = max(setup.prompt_frames, 1)
        kv_per_frame = setup.estimator_att.base_nbytes // prompt
        conformer_per_frame = setup.conformer_att.nbytes // prompt
        small = setup.conformer_cnn.nbytes + setup.estimator_cnn.nbytes
        conformer_frames = prompt + setup.tail_frames
        if self.core.conformer_trim is ConformerTrim.NONE:
            # Step-Audio2 keeps the conformer's whole history (upstream does not trim it): that part grows with
            # the reply, TOKEN_MEL_RATIO frames per token received (measured 850 frames after 252 tokens with
            # P = 300 on the stand-in, within 300 + 100 + 504)
            conformer_frames += TOKEN_MEL_RATIO * max(int(tokens), 0)
        return (
            kv_per_frame * max(prompt, setup.tail_frames)
            + conformer_per_frame * conformer_frames
            + small
            + VOCODER_STATE_BYTES
        )

    def stream_bytes(self, caches: StreamCaches, voice: CosyVoice2Voice) -> StreamBytes:
        """Bytes of storages only this stream references vs. those of its voice's shared post-prompt state."""
        shared_storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in voice.setup.tensors()}
        own, shared = 0, 0
        seen: set[int] = set()
        for t in caches.tensors():
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr in seen:
                continue
            seen.add(ptr)
            if ptr in shared_storages:
                shared += storage.nbytes()
            else:
                own += storage.nbytes()
        return StreamBytes(own=own, shared=shared)


__all__ = ["VOCODER_STATE_BYTES", "CosyVoice2Backend", "CosyVoice2Voice", "GraphSettings"]
