# SPDX-License-Identifier: Apache-2.0
"""What one CosyVoice3 stream costs chunk by chunk, ours vs upstream's re-runs: the measuring steps two reports share.

`bench token2wav --family cosyvoice3` (this folder's `run.py`, shipped) times the whole code2wav stream
with them; the developer benchmark `benchmarks/cosyvoice3_flow_stream/` of the repository checkout times
the flow alone with the same steps (and `benchmarks/causal_hift_stream/` the vocoder's upstream step), so
the two curves measure the same calls. They live here, with the shipped report, because the installed
package cannot import the checkout's `benchmarks/`.

- `StreamShape`: the chunking both use (upstream's first hop, then fixed hops, 3 lookahead tokens);
- `measure_chunk_costs`: one stream, each chunk timed (wall and process CPU), upstream's prefix re-run
  (`inference(prefix, streaming=True, finalize=False)`) timed at selected chunk indices and compared;
- `measure_final_chunk`: the stream's last call in both `FinalChunk` modes from the same state;
- `cumulative_vocode`: upstream CosyVoice3's streaming vocoder step (the whole mel so far, every chunk).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from vllm_omni_token2wav.benchmarks.common import synced_seconds

_T = TypeVar("_T")


class StreamSetupError(ValueError):
    """An input of the measured stream cannot be used (the message says which)."""


@dataclass(frozen=True)
class StreamShape:
    """How a stream of `chunks` chunks is cut: a prompt, upstream's first hop, then `hop_tokens` per chunk."""

    prompt_tokens: int
    hop_tokens: int
    chunks: int

    @property
    def first_hop(self) -> int:
        """Upstream's first hop rule: pad the prompt to a 25-token boundary, then one hop."""
        return self.hop_tokens + (-self.prompt_tokens) % 25

    @property
    def gen_tokens(self) -> int:
        """Generated tokens fed: all chunks plus the 3 lookahead tokens of the last one."""
        return self.first_hop + (self.chunks - 1) * self.hop_tokens + 3


@dataclass
class ChunkCost:
    index: int
    #: mel frames emitted by this chunk and frames before it (prompt included): the history it attends to
    frames: int
    history_frames: int
    ours_ms: list[float] = field(default_factory=list)
    baseline_ms: list[float] = field(default_factory=list)
    #: process CPU time of the same calls: the work done, robust to other processes on a busy host
    ours_cpu_ms: list[float] = field(default_factory=list)
    baseline_cpu_ms: list[float] = field(default_factory=list)
    max_abs_diff: float | None = None
    cache_mb: float | None = None

    @property
    def ours_median_ms(self) -> float:
        return statistics.median(self.ours_ms) if self.ours_ms else float("nan")

    @property
    def baseline_median_ms(self) -> float:
        return statistics.median(self.baseline_ms) if self.baseline_ms else float("nan")

    @property
    def ratio(self) -> float:
        """baseline / ours wall time (how many times cheaper the cached chunk is)."""
        return self.baseline_median_ms / self.ours_median_ms

    @property
    def cpu_ratio(self) -> float:
        """baseline / ours process CPU time."""
        if not (self.ours_cpu_ms and self.baseline_cpu_ms):
            return float("nan")
        return statistics.median(self.baseline_cpu_ms) / statistics.median(self.ours_cpu_ms)


@dataclass
class FinalChunkCost:
    """The stream's last call (once per utterance), both `FinalChunk` modes from the same state, per repeat."""

    #: new tokens the last call feeds, and the utterance's mel frames (prompt + generated) it ends
    tokens: int = 0
    utterance_frames: int = 0
    generated_seconds: float = 0.0
    full_attention_ms: list[float] = field(default_factory=list)
    full_attention_cpu_ms: list[float] = field(default_factory=list)
    block_causal_ms: list[float] = field(default_factory=list)
    block_causal_cpu_ms: list[float] = field(default_factory=list)
    #: the utterance's other calls (stream set-up + every chunk, ours), per repeat: what the last call adds to
    stream_ms: list[float] = field(default_factory=list)
    stream_cpu_ms: list[float] = field(default_factory=list)
    #: max |full attention - block-causal| over the last call's mel (the size of the difference)
    max_abs_diff: float | None = None

    def summary(self) -> dict[str, Any]:
        if not (self.full_attention_ms and self.block_causal_ms):
            return {}

        def med(values: list[float]) -> float:
            return statistics.median(values) if values else float("nan")

        full, block, stream = med(self.full_attention_ms), med(self.block_causal_ms), med(self.stream_ms)
        full_cpu, block_cpu, stream_cpu = (
            med(self.full_attention_cpu_ms),
            med(self.block_causal_cpu_ms),
            med(self.stream_cpu_ms),
        )
        return {
            "final_tokens": self.tokens,
            "utterance_frames": self.utterance_frames,
            "generated_seconds": self.generated_seconds,
            "full_attention_ms": full,
            "block_causal_ms": block,
            "full_over_block": full / block,
            "adds_ms_per_utterance": full - block,
            "adds_share_of_stream": (full - block) / (stream + block) if stream == stream else None,
            "full_attention_cpu_ms": full_cpu,
            "block_causal_cpu_ms": block_cpu,
            "adds_cpu_ms_per_utterance": full_cpu - block_cpu,
            "adds_cpu_share_of_stream": (full_cpu - block_cpu) / (stream_cpu + block_cpu)
            if stream_cpu == stream_cpu
            else None,
            "stream_ms": stream,
            "stream_cpu_ms": stream_cpu,
            "max_abs_diff": self.max_abs_diff,
        }


def cpu_timed(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> tuple[_T, float]:
    """`fn(...)` and the CPU seconds this process spent in it (all threads)."""
    start = time.process_time()
    out = fn(*args, **kwargs)
    return out, time.process_time() - start


def measure_chunk_costs(
    flow: Any,
    prompt: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    tokens: torch.Tensor,
    hops: Sequence[int],
    *,
    n_timesteps: int,
    baseline_at: Sequence[int],
    sync: Callable[[], None],
    report: list[ChunkCost],
    setup_ms: list[float],
    on_chunk: Callable[[], None] = lambda: None,
    on_mel: Callable[[int, torch.Tensor, torch.Tensor | None], None] | None = None,
    final: FinalChunkCost | None = None,
) -> None:
    """One stream over `tokens` with the given hops, each chunk timed; the baseline at `baseline_at` (1-based).

    Appends to `report` (one `ChunkCost` per chunk index, created on the first repeat) and `setup_ms`,
    so an interrupted run keeps what it measured. `on_mel(index, ours, baseline or None)` gets every
    chunk's new mel after the timed calls (the end-to-end benchmark vocodes it). With `final`, the
    tokens after the last hop's lookahead are then fed as the last call, timed in both `FinalChunk`
    modes (`measure_final_chunk`).
    """
    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import start_stream, stream_chunk

    pt, pm, spk = prompt
    (state, seconds), setup_cpu = cpu_timed(
        synced_seconds, sync, start_stream, flow, pt, pm, spk, n_timesteps=n_timesteps
    )
    setup_ms.append(1000.0 * seconds)
    stream_ms, stream_cpu_ms = 1000.0 * seconds, 1000.0 * setup_cpu
    offset = fed = 0
    for index, hop in enumerate(hops, start=1):
        end = offset + hop + 3
        ((mel, state), seconds), cpu = cpu_timed(synced_seconds, sync, stream_chunk, flow, state, tokens[:, fed:end])
        stream_ms, stream_cpu_ms = stream_ms + 1000.0 * seconds, stream_cpu_ms + 1000.0 * cpu
        if len(report) < index:
            report.append(ChunkCost(index, 2 * hop, 2 * (pt.size(1) + offset)))
        cost = report[index - 1]
        cost.ours_ms.append(1000.0 * seconds)
        cost.ours_cpu_ms.append(1000.0 * cpu)
        cost.cache_mb = state.cache_bytes / 2**20
        if index in baseline_at:
            prefix = tokens[:, :end]
            lengths = (prefix.size(1), pt, pt.size(1), pm, pm.size(1), spk)
            (full, seconds), cpu = cpu_timed(
                synced_seconds,
                sync,
                flow.inference,
                prefix,
                *lengths,
                streaming=True,
                finalize=False,
                n_timesteps=n_timesteps,
            )
            cost.baseline_ms.append(1000.0 * seconds)
            cost.baseline_cpu_ms.append(1000.0 * cpu)
            diff = (full[:, :, 2 * offset :] - mel).abs().max().item()
            cost.max_abs_diff = max(diff, cost.max_abs_diff or 0.0)
            if on_mel is not None:
                on_mel(index, mel, full[:, :, 2 * offset :])
        elif on_mel is not None:
            on_mel(index, mel, None)
        fed, offset = end, offset + hop
        on_chunk()
    if final is not None:
        final.stream_ms.append(stream_ms)
        final.stream_cpu_ms.append(stream_cpu_ms)
        measure_final_chunk(
            flow, state, tokens[:, fed:], sync=sync, cost=final, full_first=len(final.stream_ms) % 2 == 1
        )


def measure_final_chunk(
    flow: Any, state: Any, tokens: torch.Tensor, *, sync: Callable[[], None], cost: FinalChunkCost, full_first: bool
) -> None:
    """The last call of the stream at `state` (started in the default `FinalChunk.FULL_ATTENTION` mode), timed
    with full attention (a whole-utterance re-run, `finalize=True, streaming=False`, upstream's last call) and
    block-causal from the caches (the same state with `FinalChunk.BLOCK_CAUSAL`), one after the other in the
    order `full_first` says. States are immutable, so both calls start from the same stream."""
    import dataclasses

    from vllm_omni_token2wav.model_executor.layers.flow_cosyvoice3 import FinalChunk, stream_chunk

    if state.final_chunk is not FinalChunk.FULL_ATTENTION or state.replay is None:
        raise StreamSetupError("the last-call comparison needs a stream started in FinalChunk.FULL_ATTENTION mode")
    block_state = dataclasses.replace(state, final_chunk=FinalChunk.BLOCK_CAUSAL, replay=None)
    mels: dict[FinalChunk, torch.Tensor] = {}
    order = (FinalChunk.FULL_ATTENTION, FinalChunk.BLOCK_CAUSAL)
    for mode in order if full_first else order[::-1]:
        start = state if mode is FinalChunk.FULL_ATTENTION else block_state
        ((mel, done), seconds), cpu = cpu_timed(synced_seconds, sync, stream_chunk, flow, start, tokens, final=True)
        mels[mode] = mel
        wall_list, cpu_list = (
            (cost.full_attention_ms, cost.full_attention_cpu_ms)
            if mode is FinalChunk.FULL_ATTENTION
            else (cost.block_causal_ms, cost.block_causal_cpu_ms)
        )
        wall_list.append(1000.0 * seconds)
        cpu_list.append(1000.0 * cpu)
    cost.tokens = int(tokens.size(1))
    cost.utterance_frames = int(done.emitted_frames)
    cost.generated_seconds = done.generated_tokens / 25.0
    full, block = mels[FinalChunk.FULL_ATTENTION], mels[FinalChunk.BLOCK_CAUSAL]
    if full.shape != block.shape:
        raise RuntimeError(f"last call: full attention emitted {full.shape[-1]} frames, block-causal {block.shape[-1]}")
    diff = (full - block).abs().max().item() if full.numel() else 0.0
    cost.max_abs_diff = max(diff, cost.max_abs_diff or 0.0)


def cumulative_vocode(
    model: Any, mel_so_far: torch.Tensor, emitted: int, *, finalize: bool
) -> tuple[torch.Tensor, int]:
    """Upstream CosyVoice3's streaming vocoder step (`CosyVoice3Model.token2wav`): `inference` over the whole
    mel so far, keeping the samples past the `emitted` ones; returns (new samples, emitted after them)."""
    speech = model.inference(mel_so_far, finalize=finalize)[:, emitted:]
    return speech, emitted + int(speech.shape[-1])


__all__ = [
    "ChunkCost",
    "FinalChunkCost",
    "StreamSetupError",
    "StreamShape",
    "cpu_timed",
    "cumulative_vocode",
    "measure_chunk_costs",
    "measure_final_chunk",
]
