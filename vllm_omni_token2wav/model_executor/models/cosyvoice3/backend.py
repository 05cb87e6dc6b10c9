# SPDX-License-Identifier: Apache-2.0
"""`Token2WavBackend` of CosyVoice3: the DiT flow with constant-work caches and the causal HiFT.

Models and prompt features come from `CosyVoice3Token2Wav` (the facade); kernels from
`cosyvoice3.synthesis`, the same the facade runs with one row, so stage, facade and CLI share one
implementation.

| engine call     | CosyVoice3                                                                        |
|-----------------|-----------------------------------------------------------------------------------|
| `prepare_voice` | a `CosyVoice3Prompt` as sent (talker conditioning) or from reference audio + its  |
|                 | tokens (`ReferenceVoice`: embedding on the device path, 12 kHz mel, alignment)    |
| `open_stream`   | `synthesis.open_stream`: nothing computed; the flow's noise table is drawn from   |
|                 | the request's seed; the prompt's frames run inside the first chunk's launch        |
| `shape`         | the chunk's new ids (its first `min(3, received)` ids must be the lookahead the    |
|                 | previous chunk ended with: producers re-send it), the flow plan (`plan_chunk`)    |
| `run_flow`      | `synthesis.flow_rows`: one ragged launch for all rows (per-frame ops together,    |
|                 | attention per row), each row alone to float32 rounding (see the design page);     |
|                 | with graphs active the DiT segments replay (`graphs.py`)                          |
| `run_vocoder`   | `synthesis.vocoder_rows`: one row per launch (exact), or rows at equal stream     |
|                 | positions together with `batch_vocoder` (~1e-6 deviation, see the design page);   |
|                 | with graphs active a steady chunk's HiFT decoder replays                          |
| `flush`         | a 0-token last chunk: the pending lookahead tokens' mel and the vocoder's held-   |
|                 | back 8 frames (a computation, not a release: the flow has not emitted them yet)   |
| `whole`         | `synthesis.synthesize_whole` (full attention, as upstream's non-streaming path)   |
| `whole_rows`    | `synthesis.synthesize_whole_rows`: several whole utterances, the flow in one      |
|                 | launch (each row bit-identical to `whole`'s flow), the causal HiFT per row        |

Checked before launch (`shape`, ValueError naming the limit): ids in [0, 6561), the re-sent lookahead,
prompt + generated frames within the flow's 15000-frame noise table (300 s).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vllm_omni_token2wav.model_executor import buckets
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import FinalChunk, FlowStreamState, plan_chunk
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.noise import NOISE_FRAMES, check_noise
from vllm_omni_token2wav.model_executor.layers.hift_causal.batched import push_key
from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_token2wav import CosyVoice3Token2Wav
from vllm_omni_token2wav.model_executor.models.cosyvoice3.graphs import CosyVoice3Graphs, CosyVoice3GraphSettings
from vllm_omni_token2wav.model_executor.models.cosyvoice3.prompt import CosyVoice3Prompt, token_ids
from vllm_omni_token2wav.model_executor.models.cosyvoice3.synthesis import (
    StreamCaches,
    StreamRow,
    WholeUtterance,
    flow_rows,
    open_stream,
    stream_rows,
    synthesize_whole,
    synthesize_whole_rows,
    vocoder_rows,
)
from vllm_omni_token2wav.model_executor.models.cosyvoice3.voice import ReferenceVoice
from vllm_omni_token2wav.model_executor.models.token2wav_stage.backend import (
    ChunkShape,
    ChunkWork,
    StreamBytes,
    WholeWork,
)

#: What `run_flow` gives per row and `run_vocoder` takes back: the new mel `(1, 80, F)` and the next flow state.
FlowRowOut = tuple[torch.Tensor, FlowStreamState]


@dataclass(frozen=True)
class CosyVoice3Voice:
    """A prepared voice: the aligned prompt on the serving device (shared by the voice's streams, read-only)."""

    key: str
    prompt: CosyVoice3Prompt


class CosyVoice3Backend:
    """DiT flow + causal HiFT over a `CosyVoice3Token2Wav` (see the module docstring)."""

    name = "cosyvoice3-dit-causal-hift"

    def __init__(
        self,
        core: CosyVoice3Token2Wav,
        *,
        batch_vocoder: bool = False,
        kv_cache_dtype: torch.dtype | None = None,
        graphs: CosyVoice3GraphSettings | None = None,
    ) -> None:
        self.core = core
        self.batch_vocoder = bool(batch_vocoder)
        #: the K/V arena's storage dtype (`token2wav_kv_cache_dtype`); None: the flow's (fp16 with `float16`)
        self.kv_cache_dtype = kv_cache_dtype
        #: device graphs (`graphs.py`); None settings (`token2wav_device_graphs=False`): no capture objects at all
        self.graph_settings = graphs
        self.graphs: CosyVoice3Graphs | None = None
        self.use_graphs = True  # the stage's run-time switch (`Token2WavStageModel.set_device_graphs`)

    @property
    def graphs_active(self) -> bool:
        """Whether launches replay device graphs (they then want bucketed shapes from the planner)."""
        return self.use_graphs and self.graphs is not None and self.graphs.active

    @property
    def device(self) -> torch.device:
        return self.core.device

    def ensure_loaded(self) -> None:
        self.core.load_models()
        if self.graph_settings is not None and self.graphs is None:
            core = self.core
            self.graphs = CosyVoice3Graphs(
                core.flow, core.hift, core.streamer, device=self.device, settings=self.graph_settings
            )

    # ---- voices and streams -------------------------------------------------------------------

    def prepare_voice(self, key: str, source: object) -> CosyVoice3Voice:
        if isinstance(source, CosyVoice3Prompt):
            return CosyVoice3Voice(key, source.to(self.device))
        if isinstance(source, ReferenceVoice):
            return CosyVoice3Voice(key, self.core.prompt(source.audio, source.tokens))
        raise TypeError(
            f"CosyVoice3 voice {key[:40]!r}: expected prompt conditioning or reference audio with its speech tokens, "
            f"got {type(source).__name__}"
        )

    def open_stream(self, voice: CosyVoice3Voice, seed: int) -> StreamCaches:
        core = self.core
        return open_stream(
            core.flow,
            core.streamer,
            voice.prompt,
            n_timesteps=core.n_timesteps,
            noise_seed=int(seed),
            final_chunk=core.final_chunk,
            kv_dtype=self.kv_cache_dtype,
        )

    @property
    def kv_dtype(self) -> torch.dtype:
        """The dtype the streams' K/V arenas are stored in: `kv_cache_dtype`, else the flow's."""
        return self.core.flow.dtype if self.kv_cache_dtype is None else self.kv_cache_dtype

    def new_tokens(self, caches: StreamCaches, tokens: Sequence[int]) -> torch.Tensor:
        """The chunk's ids after the re-sent lookahead, `(1, m)` long on the CPU (ValueError if it does not fit)."""
        ids = token_ids(list(tokens), "codes.audio")
        overlap = len(caches.pending)
        head = tuple(int(t) for t in ids[0, :overlap].tolist())
        if head != caches.pending:
            raise ValueError(
                f"the chunk must start with the {overlap} lookahead token(s) {list(caches.pending)} the previous chunk "
                f"ended with, got {list(head)}: send the tokens from the first one not yet turned into audio "
                "(CosyVoice3's talker: the whole prefix with left_context_size = that position)"
            )
        return ids[:, overlap:]

    def shape(self, caches: StreamCaches, tokens: Sequence[int], last: bool) -> ChunkShape:
        flow = self.core.flow
        state = caches.flow
        new = self.new_tokens(caches, tokens).shape[1]
        unfed = 0 if state.unfed_prompt is None else state.unfed_prompt.shape[1]
        plan = plan_chunk(
            flow.config,
            known_tokens=state.known_tokens,
            new_tokens=unfed + new,
            prompt_tokens=state.prompt_tokens,
            committed=state.committed_frames,
            emitted=state.emitted_frames,
            final=last,
        )
        end = flow.config.token_mel_ratio * plan.known_tokens
        check_noise(state.noise, flow.config.output_size, end, "stage chunk")
        mel_frames = plan.emit_end - plan.emit_start
        if self.batch_vocoder:
            vocoder_key: object = push_key(caches.vocoder, mel_frames, last)
        else:
            vocoder_key = ("row", id(caches))  # one request per vocoder launch: exact
        return ChunkShape(
            flow_key=(state.n_timesteps, str(flow.dtype), str(flow.device)),
            flow_frames=plan.frames,
            attention_key=(plan.compute_start, plan.frames),
            vocoder_key=vocoder_key,
        )

    # ---- launches -----------------------------------------------------------------------------

    def _rows(self, works: Sequence[ChunkWork[StreamCaches]]) -> list[StreamRow]:
        return [StreamRow(work.caches, self.new_tokens(work.caches, work.tokens), work.last) for work in works]

    def run_flow(self, works: Sequence[ChunkWork[StreamCaches]], pad_frames: int) -> list[FlowRowOut]:
        graphs = self.graphs if self.graphs_active else None
        rerun = [w.last and w.caches.flow.final_chunk is FinalChunk.FULL_ATTENTION for w in works]
        forward = None
        if graphs is not None or any(rerun):
            frames = [self.shape(w.caches, w.tokens, w.last).flow_frames for w in works]
            pad_frames += _rerun_padding(frames, rerun, pad_frames)
            launched = sum(f for f, out in zip(frames, rerun, strict=True) if not out)
            if graphs is not None and launched and graphs.flow.use_for(launched + pad_frames):
                forward = graphs.flow.forward_frames
        return list(flow_rows(self.core.flow, self._rows(works), pad_frames=pad_frames, forward=forward))

    def run_vocoder(
        self, works: Sequence[ChunkWork[StreamCaches]], products: Sequence[FlowRowOut], pad_rows: int
    ) -> list[tuple[torch.Tensor, StreamCaches]]:
        graphs = self.graphs if self.graphs_active else None
        streamer = self.core.streamer if graphs is None else graphs.streamer  # same states, decoder replayed
        return vocoder_rows(streamer, self._rows(works), products, batch=self.batch_vocoder, pad_rows=pad_rows)

    def flush(self, caches: StreamCaches) -> torch.Tensor:
        """A 0-token last chunk: the mel of the pending lookahead tokens and every sample held back so far."""
        if caches.received == 0:  # nothing was generated: nothing to say
            return torch.empty(0, dtype=torch.float32, device=self.device)
        row = StreamRow(caches, torch.empty(1, 0, dtype=torch.long), True)
        ((audio, _),) = stream_rows(self.core.flow, self.core.streamer, [row])
        return audio

    def whole(self, voice: CosyVoice3Voice, tokens: Sequence[int], seed: int) -> torch.Tensor:
        core = self.core
        ids = token_ids(list(tokens), "tokens")
        audio = synthesize_whole(
            core.flow, core.hift, voice.prompt, ids, n_timesteps=core.n_timesteps, noise_seed=int(seed)
        )
        return audio.reshape(-1)

    def check_whole(self, voice: CosyVoice3Voice, tokens: Sequence[int]) -> None:
        """Before any launch: ids in [0, 6561) and prompt + generated frames within the noise table (ValueError)."""
        ids = token_ids(list(tokens), "tokens")
        prompt = int(voice.prompt.num_tokens)
        frames = self.core.flow.config.token_mel_ratio * (prompt + ids.shape[1])
        if frames > NOISE_FRAMES:
            raise ValueError(
                f"a whole utterance of {ids.shape[1]} tokens after a {prompt}-token prompt needs {frames} mel frames, "
                f"more than the flow's {NOISE_FRAMES}-frame noise table (300 s): split it"
            )

    def whole_rows(self, works: Sequence[WholeWork[CosyVoice3Voice]]) -> list[torch.Tensor]:
        """Several whole utterances in one flow launch, each row's audio equal to `whole` of it alone."""
        core = self.core
        rows = [WholeUtterance(w.voice.prompt, token_ids(list(w.tokens), "tokens"), int(w.seed)) for w in works]
        audio = synthesize_whole_rows(core.flow, core.hift, rows, n_timesteps=core.n_timesteps)
        return [a.reshape(-1) for a in audio]

    # ---- memory -----------------------------------------------------------------------------------

    def estimate_stream_bytes(self, voice: CosyVoice3Voice, tokens: int) -> int:
        """Own bytes of a stream of `voice` once it has received `tokens` generated tokens, before it exists.

        The flow's K/V arena holds every committed frame, the prompt's included: `(prompt + tokens) x
        token_mel_ratio` frames of `n_timesteps x depth x 2 CFG rows x 2 (k, v) x heads x dim_head`
        elements in the arena's dtype (`kv_dtype`: 3.6 MB per frame at full size in fp32, 1.8 MB in bf16 /
        fp16). The arena grows geometrically, but never past the frames `reserve_stream` reserved while a
        chunk ends within them, so a stream's own bytes stay within the estimate at its reservation (pinned
        on the reduced stand-in by tests/model_executor/models/token2wav_stage/test_memory_budget.py).
        """
        prompt = int(voice.prompt.tokens.shape[-1])
        return self._frames(prompt, tokens) * self.bytes_per_frame + self._small_bytes(prompt)

    #: A bound on the causal HiFT's per-stream state (mel tail, phase, source tail, conv contexts).
    VOCODER_STATE_BYTES = 256 * 1024

    def _small_bytes(self, prompt_tokens: int) -> int:
        """A stream's bytes besides the arena: the conv history (`steps x 2 convs x 2 CFG x dim x 30` in the
        flow's dtype), the prompt's mel frames not yet committed, the window ids and the vocoder's state."""
        flow = self.core.flow
        config = flow.config
        element = torch.empty((), dtype=flow.dtype).element_size()
        history = self.core.n_timesteps * 2 * 2 * config.dim * 30 * element
        prompt_mel = prompt_tokens * config.token_mel_ratio * config.output_size * element
        window = (prompt_tokens + 64) * 8
        return history + prompt_mel + window + config.output_size * element + self.VOCODER_STATE_BYTES

    @property
    def bytes_per_frame(self) -> int:
        """K/V bytes per mel frame: `n_timesteps x depth x 2 CFG x 2 (k, v) x heads x dim_head x element`."""
        config = self.core.flow.config
        element = torch.empty((), dtype=self.kv_dtype).element_size()
        return self.core.n_timesteps * config.depth * 2 * 2 * config.heads * config.dim_head * element

    def _frames(self, prompt_tokens: int, tokens: int) -> int:
        return (prompt_tokens + max(int(tokens), 0)) * self.core.flow.config.token_mel_ratio

    def reserve_stream(self, caches: StreamCaches, tokens: int) -> StreamCaches:
        """`caches` whose K/V arena grows up to the frames of `tokens` generated tokens and no further (the
        memory budget's reservation of this stream, `Token2WavStepExecutor`): doubling stops at the reservation."""
        frames = self._frames(caches.flow.prompt_tokens, tokens)
        if frames == caches.flow.kv_reserve_frames:
            return caches
        return dataclasses.replace(caches, flow=dataclasses.replace(caches.flow, kv_reserve_frames=frames))

    def stream_bytes(self, caches: StreamCaches, voice: CosyVoice3Voice) -> StreamBytes:
        """The stream's own caches (the flow's K/V arena dominates) vs. its voice's prompt (shared)."""
        return StreamBytes(own=caches.nbytes, shared=voice.prompt.nbytes)


def _rerun_padding(frames: Sequence[int], rerun: Sequence[bool], pad_frames: int) -> int:
    """Padding for the frames the plan counted for full-attention last chunks (`rerun`), which re-run their
    utterance outside the launch: when the planned launch is a bucket (padded, or exactly one) their frames
    become padding, so the launch keeps its planned, captured size (padding changes no row)."""
    if not any(rerun) or (pad_frames == 0 and sum(frames) not in buckets.stage_frame_buckets()):
        return 0
    return sum(f for f, out in zip(frames, rerun, strict=True) if out)


__all__ = ["CosyVoice3Backend", "CosyVoice3Voice"]
