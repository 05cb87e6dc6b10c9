# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3 speech tokens + prompt -> 24 kHz audio: whole utterances and streams (DiT flow + causal HiFT).

Whole utterance (`synthesize_whole`), as upstream `CosyVoice3Model.tts(stream=False)`: the flow over
[prompt | tokens] with full attention and `finalize=True`, then the causal HiFT over the whole mel
(`inference(mel, finalize=True)`): 2 x 480 samples per token. `synthesize_whole_rows` runs several in one
flow launch (`layers/flow_cosyvoice3/whole_rows.py`), each equal to its run alone.

Streaming, for one or many requests (`open_stream`, `stream_rows`): a request's `StreamCaches` is the
flow's `FlowStreamState` (constant-work caches, `layers/flow_cosyvoice3/streaming.py`) and the vocoder's
`CausalHiFTStreamState` (bounded, `layers/hift_causal/stream.py`). A chunk feeds the generated ids received since the
previous chunk:

- flow: `stream_chunks` (one launch for all rows, `layers/flow_cosyvoice3/batched.py`) returns the mel of every
  token whose 3 lookahead tokens have arrived (all of them at the last chunk);
- vocoder: the new mel is pushed to the causal HiFT (`COSYVOICE3_STREAM`: the reference's non-final
  `inference` holds the last 8 frames back; the last chunk finalises and releases them).

So a stream's audio is the concatenation of its chunks' audio, and equals the whole-utterance vocoder
on the streamed mel. The flow's streamed mel equals upstream's prefix re-runs (block-causal mask);
the last chunk by default equals upstream's last call (full attention, `FinalChunk.FULL_ATTENTION`), or
is block-causal like the others with `FinalChunk.BLOCK_CAUSAL` (see docs/design/cosyvoice3.md).

Noise. The flow's starting noise is a table drawn from `noise_seed` (`layers/flow_cosyvoice3/noise.py`; seed 0 is
upstream's fixed table): per request when the caller passes a per-request seed. The HiFT's source
noise is the reference's fixed table (indexed by absolute sample), the same for every request, as in
CosyVoice; so a request's audio depends only on its tokens, prompt and seed.

Vocoder launches: rows of several requests may share one push only at equal stream positions
(`hift.batched.push_key`); `batch_vocoder=False` (the default of the stage) pushes each row alone,
which is exact, because the decoder's float32 convolutions round differently at batch > 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import (
    DEFAULT_FINAL_CHUNK,
    CausalMaskedDiffWithDiT,
    FinalChunk,
    FlowStreamState,
    start_stream,
    stream_chunks,
)
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.batched import FramesForward
from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3.whole_rows import WholeRow, inference_rows
from vllm_omni_token2wav.model_executor.layers.hift_causal import CausalHiFTGenerator, CausalHiFTStreamer
from vllm_omni_token2wav.model_executor.layers.hift_causal.batched import push_key, push_rows
from vllm_omni_token2wav.model_executor.layers.hift_causal.stream import CausalHiFTStreamState
from vllm_omni_token2wav.model_executor.models.cosyvoice3.prompt import CosyVoice3Prompt

#: Mel frames per token and samples per mel frame: 960 samples (40 ms) per token.
SAMPLES_PER_TOKEN = 2 * 480


@torch.inference_mode()
def synthesize_whole(
    flow: CausalMaskedDiffWithDiT,
    hift: CausalHiFTGenerator,
    prompt: CosyVoice3Prompt,
    tokens: torch.Tensor,
    *,
    n_timesteps: int,
    noise_seed: int,
) -> torch.Tensor:
    """Audio `(1, 960 T)` float32 of generated ids `(1, T)` (T >= 1) in the voice of `prompt`."""
    mel = flow.inference(
        tokens.to(flow.device),
        tokens.shape[1],
        prompt.tokens,
        prompt.num_tokens,
        prompt.mel,
        prompt.mel.shape[1],
        prompt.embedding,
        streaming=False,
        finalize=True,
        n_timesteps=n_timesteps,
        noise_seed=noise_seed,
    )
    return hift.inference(mel, finalize=True)


@dataclass(frozen=True)
class WholeUtterance:
    """One row of `synthesize_whole_rows`: generated ids `(1, T)` in the voice of `prompt`, noise from `noise_seed`."""

    prompt: CosyVoice3Prompt
    tokens: torch.Tensor
    noise_seed: int


@torch.inference_mode()
def synthesize_whole_rows(
    flow: CausalMaskedDiffWithDiT,
    hift: CausalHiFTGenerator,
    rows: Sequence[WholeUtterance],
    *,
    n_timesteps: int,
) -> list[torch.Tensor]:
    """`synthesize_whole` of every row, the flow in one launch (`whole_rows.inference_rows`, each row's mel
    bit-identical to its run alone), then the causal HiFT per row (exact: stacked rows round differently)."""
    whole = [
        WholeRow(row.tokens.to(flow.device), row.prompt.tokens, row.prompt.mel, row.prompt.embedding, row.noise_seed)
        for row in rows
    ]
    mels = inference_rows(flow, whole, n_timesteps=n_timesteps)
    return [hift.inference(mel, finalize=True) for mel in mels]


@dataclass(frozen=True)
class StreamCaches:
    """One request's stream: flow and vocoder states plus the last <= 3 ids received (the lookahead a
    producer re-sends at the start of its next chunk). Immutable; a chunk returns new caches."""

    flow: FlowStreamState
    vocoder: CausalHiFTStreamState
    #: the flow's lookahead (3 tokens): how many of the last received ids stay pending
    lookahead: int
    pending: tuple[int, ...] = ()
    received: int = 0
    finished: bool = False

    @property
    def nbytes(self) -> int:
        """Device memory held for this stream (the flow's K/V arena dominates)."""
        v = self.vocoder
        tensors = [v.mel_tail, v.phase, v.source_tail, v.post, *v.contexts.values()]
        return self.flow.cache_bytes + sum(t.nbytes for t in tensors)


def open_stream(
    flow: CausalMaskedDiffWithDiT,
    streamer: CausalHiFTStreamer,
    prompt: CosyVoice3Prompt,
    *,
    n_timesteps: int,
    noise_seed: int,
    final_chunk: FinalChunk = DEFAULT_FINAL_CHUNK,
    run_prompt: bool = False,
    kv_dtype: torch.dtype | None = None,
) -> StreamCaches:
    """A new stream in the voice of `prompt`. With `run_prompt=False` nothing is computed: the prompt's
    frames run inside the first chunk's flow launch (batched with other rows). `kv_dtype`: the K/V arena's
    storage dtype (None: the flow's)."""
    state = start_stream(
        flow,
        prompt.tokens,
        prompt.mel,
        prompt.embedding,
        n_timesteps=n_timesteps,
        noise_seed=noise_seed,
        final_chunk=final_chunk,
        run_prompt=run_prompt,
        kv_dtype=kv_dtype,
    )
    return StreamCaches(flow=state, vocoder=streamer.start(), lookahead=flow.config.pre_lookahead_len)


@dataclass(frozen=True)
class StreamRow:
    """A chunk of one stream: the generated ids `(1, m)` received since its previous chunk (m may be 0)."""

    caches: StreamCaches
    tokens: torch.Tensor
    last: bool


def flow_rows(
    flow: CausalMaskedDiffWithDiT,
    rows: Sequence[StreamRow],
    *,
    pad_frames: int = 0,
    forward: FramesForward | None = None,
) -> list[tuple[torch.Tensor, FlowStreamState]]:
    """The flow part of the rows' chunks, one launch: (new mel `(1, 80, F)`, next flow state) per row.

    `forward`: the estimator's per-frame part replayed from device graphs (`flow_cosyvoice3.graphed`)."""
    launch = [(r.caches.flow, r.tokens, r.last) for r in rows]
    return stream_chunks(flow, launch, pad_frames=pad_frames, forward=forward)


def vocoder_rows(
    streamer: CausalHiFTStreamer,
    rows: Sequence[StreamRow],
    flows: Sequence[tuple[torch.Tensor, FlowStreamState]],
    *,
    batch: bool = False,
    pad_rows: int = 0,
) -> list[tuple[torch.Tensor, StreamCaches]]:
    """The vocoder part: (audio `(samples,)`, next caches) per row.

    `batch=True` pushes rows at equal positions (`push_key`) together (`pad_rows` extra copies of a
    group's first row, dropped); otherwise each row alone, which is exact.
    """
    results: list[tuple[torch.Tensor, StreamCaches] | None] = [None] * len(rows)
    groups: dict[object, list[int]] = {}
    for i, (row, (mel, _)) in enumerate(zip(rows, flows, strict=True)):
        key = push_key(row.caches.vocoder, int(mel.shape[-1]), row.last) if batch else i
        groups.setdefault(key, []).append(i)
    for members in groups.values():
        last = rows[members[0]].last
        states = [rows[i].caches.vocoder for i in members]
        mels = [flows[i][0] for i in members]
        outs = push_rows(streamer, states, mels, finalize=last, pad_rows=pad_rows if batch else 0)
        for i, (audio, vocoder) in zip(members, outs, strict=True):
            results[i] = (audio.reshape(-1), _advance(rows[i], flows[i][1], vocoder))
    return [r for r in results if r is not None]


def _advance(row: StreamRow, flow: FlowStreamState, vocoder: CausalHiFTStreamState) -> StreamCaches:
    ids = tuple(int(t) for t in row.tokens.reshape(-1).tolist())
    keep = row.caches.lookahead
    pending = (row.caches.pending + ids)[-keep:] if keep and not row.last else ()
    return dataclasses.replace(
        row.caches,
        flow=flow,
        vocoder=vocoder,
        pending=pending,
        received=row.caches.received + len(ids),
        finished=row.last,
    )


def stream_rows(
    flow: CausalMaskedDiffWithDiT,
    streamer: CausalHiFTStreamer,
    rows: Sequence[StreamRow],
    *,
    batch_vocoder: bool = False,
) -> list[tuple[torch.Tensor, StreamCaches]]:
    """Flow then vocoder for every row: (new audio `(samples,)` float32, next caches), in row order."""
    flows = flow_rows(flow, rows)
    return vocoder_rows(streamer, rows, flows, batch=batch_vocoder)


__all__ = [
    "SAMPLES_PER_TOKEN",
    "StreamCaches",
    "StreamRow",
    "WholeUtterance",
    "flow_rows",
    "open_stream",
    "stream_rows",
    "synthesize_whole",
    "synthesize_whole_rows",
    "vocoder_rows",
]
