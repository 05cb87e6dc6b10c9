# SPDX-License-Identifier: Apache-2.0
"""One scheduler step of the Token2Wav stage: admit every segment, plan the launches, run them, commit.

`Token2WavStepExecutor.step(segments)` is what a stage model's `forward` does after the adapter
(`contract.py`) has read the step (and after the idle-stream sweep, which `forward` runs on every
call, work or not), and it is family-agnostic: models are behind a
`Token2WavBackend`, stream rules in `state.py`, launch grouping in `planner.py`.

1. Admit each segment in input order, against the stream state found at the START of the step
   (`state.admit`), with its voice prepared and its chunk shape checked by the backend. A second
   segment of the same request in one step is rejected. Anything wrong becomes that segment's
   error message (request id, expected vs got); nothing has run yet.
2. Plan (`plan_step`) and run the flow launches, then the vocoder launches of the rows whose flow
   succeeded. A launch that raises is re-run row by row: only rows that fail alone get an error.
   Whole utterances share launches (`plan_whole`, at most `max_rows` rows) where the backend has `whole_rows`
   (each row equal to its run alone; a failed launch is re-run row by row too), else run one by one; 0-token last chunks
   release the held-back tail; 0-token non-final chunks (segment boundaries) just advance.
3. Commit: every segment that succeeded replaces its stream state (or ends it at its last chunk);
   a failed segment leaves its stream as it was. Results come back in input order.

Memory budget (`StepExecutorConfig.memory_budget`, `memory_budget.py`): before step 1, a chunk that
would open a new stream is checked against the budget: the live streams' bytes (`backend.stream_bytes`,
a voice's shared bytes once), the estimates of streams already waiting ahead of it and of streams
opened earlier in this step, plus its own estimate (`BytesModel`). If that exceeds the budget the
segment is HELD (its result is empty audio, nothing runs, its stream does not exist yet) and the
request waits; its later chunks are held behind it. When a later step brings a segment of a waiting
request and its held chunks now fit, they run in order, one round per chunk inside that step (the
same chunking as alone, so the same audio), and the step returns their audio concatenated. A chunk
whose stream could never fit alone, or a waiting stream whose last chunk arrives while it still does
not fit (the engine ends the request after that step, so its audio could come no later), is that
segment's error naming its tokens, the bytes and the budget. A one-chunk stream and a whole utterance
live for one step only: they are refused only if they could never fit alone, and otherwise run.
Streams that grow (a backend whose `estimate_stream_bytes` grows with tokens: CosyVoice3) are counted
at a reservation in tokens: their first chunk plus `reserve_tokens` at admission; a chunk going past it
first grows the reservation (doubled where that fits, else to what it needs), and is held (the live
stream waits) when even that does not fit; one that can never fit, or whose last chunk arrives while it
waits, fails and its stream is dropped. `backend.reserve_stream` caps the caches' growth at the
reservation, so what a stream holds stays within what it is counted at.

Noise: a stream's NSF generator is seeded from `meta.seed` or, by default, from
`sha256(stage seed, request id, epoch)`, so a request's audio depends on its own inputs only and
a request run alone or batched with any others gives the same audio.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from vllm_omni_token2wav.logger import init_logger
from vllm_omni_token2wav.model_executor.models.token2wav_stage.backend import (
    ChunkWork,
    StreamBytes,
    Token2WavBackend,
    WholeWork,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.contract import Segment, SegmentKind, SegmentResult
from vllm_omni_token2wav.model_executor.models.token2wav_stage.memory_budget import OPTION, BytesModel, MemorySnapshot
from vllm_omni_token2wav.model_executor.models.token2wav_stage.planner import (
    Launch,
    PlanItem,
    StepPlan,
    plan_step,
    plan_whole,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.state import (
    ChunkRejectedError,
    Ended,
    StreamState,
    admit,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.store import StreamStore
from vllm_omni_token2wav.model_executor.models.token2wav_stage.voice import (
    DEFAULT_VOICE,
    VoiceRequest,
    normalize_reference,
)

logger = init_logger(__name__)

#: Exceptions that mean "this request's input cannot be served" (its error message is the answer).
REQUEST_ERRORS = (ValueError, FileNotFoundError, RuntimeError, TypeError, IndexError)


@dataclass(frozen=True)
class StepExecutorConfig:
    max_rows: int = 32
    pad_to_buckets: bool = False
    seed: int = 0
    reference_seconds: float = 6.0
    voice_cache_size: int = 16
    #: What `backend.prepare_voice` gets for a voice source (request's or default) and `reference_seconds`;
    #: None: `voice.normalize_reference` (24 kHz mono, fixed length). CosyVoice3 passes sources through.
    load_voice: Callable[[object, float], object] | None = None
    #: Bytes the live streams may hold (`memory_budget.py`); None: no budget.
    memory_budget: int | None = None
    #: Tokens a new stream reserves at admission beyond those it brings (`token2wav_stream_reserve_s` x 25):
    #: a backend whose streams grow with their length (`estimate_stream_bytes` growing: CosyVoice3) has its
    #: growth checked against the budget chunk by chunk; a reservation makes those checks pass up front.
    reserve_tokens: int = 0
    #: Streams admitted at once (`token2wav_max_streams`); None: only the budget bounds them. A new stream beyond
    #: it waits like one over the budget (a live stream is never evicted for it); a waiting stream whose last
    #: chunk arrives runs anyway when its memory fits (it ends within that step, so the bound is exceeded for
    #: one step only, where refusing it would lose the request's audio).
    max_streams: int | None = None


@dataclass
class _Item:
    """A segment that passed admission, and what happened to it in this step."""

    segment: Segment
    kind: str  # "chunk", "flush", "advance", "end", "whole"
    epoch: int = 0
    chunk_seq: int = 0
    voice_key: str = ""
    voice: object = None
    caches: object = None
    previous: StreamState | None = None
    seed: int = 0
    product: object = None
    audio: torch.Tensor | None = None
    new_caches: object = None
    error: str | None = None


class Token2WavStepExecutor:
    """Streams by request key and the step loop over a `Token2WavBackend` (see the module docstring).

    `default_voice` is the voice of requests that bring none: a path, encoded bytes or
    `(waveform, rate)`, normalised like every other reference.
    """

    def __init__(
        self,
        backend: Token2WavBackend[Any, Any, Any],
        store: StreamStore,
        default_voice: object,
        config: StepExecutorConfig | None = None,
    ) -> None:
        self.backend = backend
        self.store = store
        self.config = config or StepExecutorConfig()
        self._default_voice = default_voice
        self._voices: OrderedDict[str, object] = OrderedDict()
        self.last_plan: StepPlan = StepPlan()
        #: The noise seed of every stream the last step opened and every whole utterance it ran, by state
        #: key (what `VLLM_OMNI_TOKEN2WAV_STAGE_STATS` reports, so a test can rebuild a request's noise).
        self.last_seeds: dict[str, int] = {}
        #: Own bytes per token measured on committed streams (the estimate of a new stream).
        self.bytes_model = BytesModel()
        hint = getattr(backend, "stream_bytes_per_token", None)
        if isinstance(hint, int | float) and hint > 0:
            self.bytes_model.per_token = float(hint)
        #: Requests waiting for memory, in arrival order: their held segments (oldest first).
        self._waiting: OrderedDict[str, list[Segment]] = OrderedDict()
        #: When each waiting request last sent a segment; one silent for the store's idle timeout is dropped,
        #: so a request that vanished without a finish notice does not hold its reservation forever.
        self._touched: dict[str, float] = {}
        self.clock: Callable[[], float] = time.monotonic
        #: Tokens reserved for each live stream (budget on, `estimate_stream_bytes` backends): what it is counted
        #: at, and (`backend.reserve_stream`) how far its caches may grow; a chunk going past it must fit first.
        self._reserved: dict[str, int] = {}
        #: Streams that had to wait, and segments refused by the budget, since construction.
        self.budget_waits = 0
        self.budget_refusals = 0
        #: Launches of whole utterances since construction (one per utterance without `backend.whole_rows`).
        self.whole_launches = 0

    # ---- voices ---------------------------------------------------------------------------

    def voice(self, request: VoiceRequest | None) -> tuple[str, object]:
        """(voice key, prepared voice) for a request's voice (None: the default), cached by key."""
        request = request or DEFAULT_VOICE
        prepared = self._voices.get(request.key)
        if prepared is None:
            source = request.source
            if source is None:
                source = str(self._default_voice) if isinstance(self._default_voice, Path) else self._default_voice
            load = self.config.load_voice or normalize_reference
            try:
                prepared = self.backend.prepare_voice(request.key, load(source, self.config.reference_seconds))
            except ValueError as exc:  # e.g. the front end's prompt checks: say which voice was refused
                raise ValueError(f"{request.label}: {exc}") from exc
            self._voices[request.key] = prepared
            while len(self._voices) > max(self.config.voice_cache_size, 1):
                self._voices.popitem(last=False)
        else:
            self._voices.move_to_end(request.key)
        return request.key, prepared

    def noise_seed(self, request_id: str, epoch: int) -> int:
        digest = hashlib.sha256(f"{self.config.seed}:{request_id}:{epoch}".encode()).digest()
        return int.from_bytes(digest[:8], "little") & (2**63 - 1)

    # ---- the step ---------------------------------------------------------------------------

    def step(self, segments: Sequence[Segment]) -> list[SegmentResult]:
        self.last_seeds = {}
        budget, limit = self.config.memory_budget, self.config.max_streams
        decides = (budget is not None and any(self._opens(s) or self._grows(s) for s in segments)) or (
            limit is not None and any(map(self._opens, segments))
        )
        if not self._waiting and not decides:
            return self._step_once(segments)  # nothing waits, opens or outgrows its reservation: nothing to decide
        return self._step_with_budget(segments)

    def _grows(self, seg: Segment) -> bool:
        """Whether `seg` takes a live stream past the bytes of its reservation (arithmetic only)."""
        estimate = getattr(self.backend, "estimate_stream_bytes", None)
        if estimate is None or seg.kind is not SegmentKind.CHUNK or seg.error is not None or not seg.tokens:
            return False
        state = self.store.get(seg.key)
        if state is None:
            return False
        reserved = self._reserved.get(seg.key, state.tokens)
        return int(estimate(state.voice, state.tokens + len(seg.tokens))) > int(estimate(state.voice, reserved))

    def _opens(self, seg: Segment) -> bool:
        """Whether `seg` may start something the budget decides on: a new stream or a whole utterance."""
        if seg.error is not None or not seg.tokens:
            return False
        return seg.kind is SegmentKind.WHOLE or (seg.kind is SegmentKind.CHUNK and self.store.get(seg.key) is None)

    def _step_once(self, segments: Sequence[Segment]) -> list[SegmentResult]:
        """One round: admit, plan, launch, commit (`segments[i].index == i`)."""
        results: list[SegmentResult | None] = [None] * len(segments)
        items: list[_Item] = []
        seen: dict[str, int] = {}
        for seg in segments:
            if seg.error is not None:
                results[seg.index] = SegmentResult(error=seg.error)
                continue
            if seg.kind is SegmentKind.PLACEHOLDER:
                results[seg.index] = SegmentResult()
                continue
            if seg.key in seen:
                results[seg.index] = SegmentResult(
                    error=f"request {seg.request_id}: a second segment of this request in one step (the first is "
                    f"segment {seen[seg.key]}); one chunk per request per step"
                )
                continue
            seen[seg.key] = seg.index
            try:
                items.append(self._admit(seg))
            except REQUEST_ERRORS as exc:
                results[seg.index] = SegmentResult(error=_message(seg, exc))

        chunks = [it for it in items if it.kind == "chunk"]
        self._run_chunks(chunks)
        self._run_wholes([it for it in items if it.kind == "whole"])
        for it in items:
            if it.kind == "flush":
                self._guard(it, lambda it=it: self.backend.flush(it.caches))
        self._commit(items)
        for it in items:
            results[it.segment.index] = SegmentResult(error=it.error) if it.error else SegmentResult(audio=it.audio)
        return [r if r is not None else SegmentResult() for r in results]

    def finish(self, keys: Sequence[str]) -> int:
        """Free the streams of finished requests (the runner's `on_requests_finished`), and their held chunks."""
        keys = [str(k) for k in keys]
        for key in keys:
            self._waiting.pop(key, None)
            self._touched.pop(key, None)
            self._reserved.pop(key, None)
        return self.store.forget(keys)

    # ---- memory budget ----------------------------------------------------------------------------

    def live_bytes(self) -> int:
        """Bytes the live streams count against the budget: each voice's shared bytes once, and each stream's
        own bytes or its reservation (`estimate_stream_bytes` at its tokens so far), whichever is larger: a
        CosyVoice2-flow stream reserves its trimmed bound from the start, so it never outgrows its count."""
        estimate = getattr(self.backend, "estimate_stream_bytes", None)
        own, shared = 0, {}
        for state in self.store.states():
            usage = self.backend.stream_bytes(state.caches, state.voice)
            tokens = self._reserved.get(state.key, state.tokens)
            reserved = int(estimate(state.voice, max(tokens, state.tokens))) if estimate is not None else 0
            own += max(usage.own, reserved)
            shared[state.voice_key] = usage.shared
        return own + sum(shared.values())

    def memory_snapshot(self) -> MemorySnapshot:
        """The budget, what the live streams hold and what waits (the stage stats' memory fields)."""
        waiting = sum(self._estimate(held) for held in self._waiting.values())
        return MemorySnapshot(
            budget_bytes=self.config.memory_budget,
            live_bytes=self.live_bytes(),
            waiting_streams=len(self._waiting),
            waiting_bytes=waiting,
            bytes_per_token=self.bytes_model.per_token,
        )

    def _step_with_budget(self, segments: Sequence[Segment]) -> list[SegmentResult]:
        """Hold what does not fit, run what does (waiting streams' held chunks in extra rounds); module docstring."""
        budget, limit = self.config.memory_budget, self.config.max_streams
        results: list[SegmentResult | None] = [None] * len(segments)
        now_s = self.clock()
        for key in [k for k in self._waiting if now_s - self._touched.get(k, now_s) > self.store.idle_timeout_s]:
            held = self._waiting.pop(key)
            self._touched.pop(key, None)
            logger.warning(
                "token2wav stage: request %s waited for admission and sent nothing for more than %.0f s; its %d held "
                "chunk(s) are dropped",
                held[0].request_id,
                self.store.idle_timeout_s,
                len(held),
            )
        live_keys = {state.key for state in self.store.states()}
        self._reserved = {k: v for k, v in self._reserved.items() if k in live_keys}
        used = self.live_bytes() if budget is not None else 0  # live streams + streams opened in this step
        ahead = 0  # estimates of streams still waiting
        live_n = len(live_keys)  # live streams + streams opened in this step (`max_streams`)
        ahead_n = 0  # new streams still waiting
        rounds: dict[int, list[Segment]] = {}  # original index -> segments to run in order (held ones first)
        present = {
            seg.key: seg for seg in segments if seg.error is None and seg.kind is SegmentKind.CHUNK and seg.chunk
        }
        handled: set[int] = set()
        # live streams waiting to grow go first: their audio has started, and only they can free memory
        order = sorted(self._waiting.items(), key=lambda kv: kv[0] not in live_keys)
        for key, held in order:
            seg = present.get(key)
            tokens = sum(len(h.tokens) for h in held) + (len(seg.tokens) if seg is not None else 0)
            if key in live_keys:
                if seg is None:
                    ahead += self._growth(key, tokens, budget, used)[1]
                    continue
                handled.add(seg.index)
                assert seg.chunk is not None
                self._touched[key] = now_s
                result, extra = self._grow_or_hold(seg, held, used, budget)
                results[seg.index] = result
                if result is None:
                    rounds[seg.index] = [*held, seg]
                    used += extra
                elif result.error is None:
                    ahead += extra
                continue
            reserve, need = self._reservation([*held, seg] if seg is not None else held, budget)
            if seg is None:
                ahead += need
                ahead_n += 1
                continue
            handled.add(seg.index)
            assert seg.chunk is not None
            self._touched[key] = now_s
            fits = budget is None or used + ahead + need <= budget
            if fits and (limit is None or live_n + ahead_n < limit or seg.chunk.last):
                # a last chunk over the stream count runs now: the stream ends within this step
                del self._waiting[key]
                del self._touched[key]
                rounds[seg.index] = [*held, seg]
                used += need
                live_n += not seg.chunk.last
                self._reserve(key, reserve)
            elif seg.chunk.last:
                del self._waiting[key]
                del self._touched[key]
                self.budget_refusals += 1
                results[seg.index] = SegmentResult(
                    error=f"request {seg.request_id}: waited for memory, and its last chunk arrived before enough was "
                    f"free: its stream needs about {need} bytes for {tokens} tokens, the live streams hold {used} and "
                    f"streams waiting ahead of it {ahead}, over {OPTION}={budget} bytes; retry, or raise the budget"
                )
            else:
                held.append(seg)
                results[seg.index] = SegmentResult()
                ahead += need
                ahead_n += 1
        for seg in segments:
            if seg.index in handled or (budget is None and limit is None) or seg.error is not None or not seg.tokens:
                continue
            if budget is not None and self._grows(seg):
                handled.add(seg.index)
                result, extra = self._grow_or_hold(seg, [], used, budget)
                results[seg.index] = result
                if result is None:
                    rounds[seg.index] = [seg]
                    used += extra
                elif result.error is None:
                    ahead += extra
                continue
            if seg.kind is SegmentKind.WHOLE:
                need = self._estimate([seg]) if budget is not None else 0
                if budget is not None and need > budget:
                    handled.add(seg.index)
                    results[seg.index] = SegmentResult(error=self._never_fits(seg, need, budget))
                continue
            if seg.kind is not SegmentKind.CHUNK or seg.chunk is None or self.store.get(seg.key) is not None:
                continue
            try:  # only a chunk that may open a stream is held; a rejected one gets its error from the round
                admit(seg.request_id, seg.chunk, seg.voice, None, self.store.ended(seg.key))
            except ChunkRejectedError:
                continue
            reserve, need = self._reservation([seg], budget) if not seg.chunk.last else (0, self._estimate([seg]))
            fits = budget is None or used + ahead + need <= budget
            if budget is not None and need > budget:
                handled.add(seg.index)
                results[seg.index] = SegmentResult(error=self._never_fits(seg, need, budget))
            elif (fits and (limit is None or live_n + ahead_n < limit)) or seg.chunk.last:
                # a one-chunk stream (MiniCPM-o's sync path) ends within this step, like a whole utterance: it
                # cannot wait (the engine ends the request with this step) and holds nothing afterwards
                used += need
                if not seg.chunk.last:
                    live_n += 1
                    self._reserve(seg.key, reserve)
            else:
                handled.add(seg.index)
                self._waiting[seg.key] = [seg]
                self._touched[seg.key] = now_s
                self.budget_waits += 1
                results[seg.index] = SegmentResult()
                ahead += need
                ahead_n += 1
                logger.info(
                    "token2wav stage: request %s waits for admission (needs ~%d bytes, live %d, budget %s; "
                    "streams live %d, waiting %d, max %s)",
                    seg.request_id,
                    need,
                    used,
                    budget,
                    live_n,
                    ahead_n,
                    limit,
                )
        now = [seg for seg in segments if seg.index not in handled]
        queues = {i: list(q) for i, q in rounds.items()}
        audio: dict[int, list[torch.Tensor]] = {i: [] for i in queues}
        batch = now + [q.pop(0) for q in queues.values()]
        origin = [seg.index for seg in now] + list(queues)
        while batch:
            out = self._step_once([replace(seg, index=i) for i, seg in enumerate(batch)])
            for index, result in zip(origin, out, strict=True):
                if index not in queues:
                    results[index] = result
                elif result.error is not None:
                    results[index] = result
                    queues[index] = []  # its later held chunks cannot run against a stream that did not advance
                elif result.audio is not None:
                    audio[index].append(result.audio)
            origin = [i for i, q in queues.items() if q and results[i] is None]
            batch = [queues[i].pop(0) for i in origin]
        for index, parts in audio.items():
            if results[index] is None:
                results[index] = SegmentResult(audio=torch.cat(parts) if parts else None)
        return [r if r is not None else SegmentResult() for r in results]

    def _reservation(self, segments: Sequence[Segment], budget: int | None) -> tuple[int, int]:
        """(tokens reserved, bytes) of a new stream admitted with `segments`: its tokens plus `reserve_tokens`,
        or only its tokens where the reservation alone would exceed the whole budget (it may still be short)."""
        tokens = sum(len(s.tokens) for s in segments)
        estimate = getattr(self.backend, "estimate_stream_bytes", None)
        if estimate is None or self.config.reserve_tokens <= 0:
            return tokens, self._estimate(segments)
        try:
            _, voice = self.voice(segments[0].voice)
        except REQUEST_ERRORS:
            return tokens, self._estimate(segments)
        full = int(estimate(voice, tokens + self.config.reserve_tokens))
        if budget is not None and full > budget:
            return tokens, int(estimate(voice, tokens))
        return tokens + self.config.reserve_tokens, full

    def _reserve(self, key: str, tokens: int) -> None:
        if hasattr(self.backend, "estimate_stream_bytes"):
            self._reserved[key] = tokens

    def _growth(self, key: str, extra_tokens: int, budget: int | None, used: int) -> tuple[int, int]:
        """(new reservation in tokens, extra bytes) for live stream `key` receiving `extra_tokens` more: the
        reservation doubles (amortised arena copies) where that fits the budget, else grows to what it needs."""
        state = self.store.get(key)
        assert state is not None
        estimate = self.backend.estimate_stream_bytes  # type: ignore[attr-defined]
        current = max(self._reserved.get(key, state.tokens), state.tokens)
        after = state.tokens + extra_tokens
        if after <= current:
            return current, 0
        held = int(estimate(state.voice, current))
        doubled = max(after, 2 * current, current + self.config.reserve_tokens)
        free = None if budget is None else budget - used
        for tokens in (doubled, after):
            extra = int(estimate(state.voice, tokens)) - held
            if free is None or extra <= free or tokens == after:
                return tokens, max(extra, 0)
        raise AssertionError("unreachable")

    def _grow_or_hold(
        self, seg: Segment, held: list[Segment], used: int, budget: int | None
    ) -> tuple[SegmentResult | None, int]:
        """A live stream's chunk past its reservation, and the extra bytes: None (the reservation grew; run
        `held` + `seg`), an empty result (held: the stream waits for memory), or an error (it can never, or no
        longer, fit: its stream is dropped, freeing what it held)."""
        assert seg.chunk is not None
        key = seg.key
        state = self.store.get(key)
        assert state is not None
        extra_tokens = sum(len(h.tokens) for h in held) + len(seg.tokens)
        tokens, extra = self._growth(key, extra_tokens, budget, used)
        if budget is None or used + extra <= budget:
            self._reserved[key] = tokens
            self._waiting.pop(key, None)
            self._touched.pop(key, None)
            return None, extra
        need = int(self.backend.estimate_stream_bytes(state.voice, state.tokens + extra_tokens))  # type: ignore[attr-defined]
        if need > budget or seg.chunk.last:
            self._waiting.pop(key, None)
            self._touched.pop(key, None)
            self._reserved.pop(key, None)
            # its audio cannot be finished: free what it holds for the others; its later chunks are rejected
            self.store.drop(key, f"was dropped by {OPTION} (its stream could not grow)")
            self.budget_refusals += 1
            why = (
                f"more than the whole {OPTION}={budget} bytes: it can never finish on this stage"
                if need > budget
                else f"its last chunk arrived while the other live streams hold {used - self._counted(state)} bytes "
                f"of {OPTION}={budget}"
            )
            return SegmentResult(
                error=f"request {seg.request_id}: its stream grew to {state.tokens + extra_tokens} tokens, which need "
                f"about {need} bytes of stream memory ({self.backend.name} backend's estimate), {why}; send a "
                "shorter reply, raise the budget, or reserve more per stream (token2wav_stream_reserve_s) so "
                "fewer streams start at once"
            ), 0
        if key not in self._waiting:
            self._waiting[key] = []
            self.budget_waits += 1
            logger.info(
                "token2wav stage: request %s waits for memory to grow (needs ~%d more bytes, live %d, budget %d)",
                seg.request_id,
                extra,
                used,
                budget,
            )
        self._waiting[key] = [*held, seg]
        self._touched[key] = self.clock()
        return SegmentResult(), extra

    def _counted(self, state: StreamState) -> int:
        """What live stream `state` counts against the budget (see `live_bytes`)."""
        estimate = self.backend.estimate_stream_bytes  # type: ignore[attr-defined]
        usage = self.backend.stream_bytes(state.caches, state.voice)
        return max(usage.own, int(estimate(state.voice, max(self._reserved.get(state.key, 0), state.tokens))))

    def _estimate(self, segments: Sequence[Segment]) -> int:
        """Own bytes of a stream after `segments`: the backend's `estimate_stream_bytes`, else `bytes_model`."""
        tokens = sum(len(s.tokens) for s in segments)
        estimate = getattr(self.backend, "estimate_stream_bytes", None)
        if estimate is None:
            return self.bytes_model.estimate(tokens)
        try:
            _, voice = self.voice(segments[0].voice)
        except REQUEST_ERRORS:  # the round that runs the segment reports the voice's error
            return self.bytes_model.estimate(tokens)
        return int(estimate(voice, tokens))

    def _never_fits(self, seg: Segment, need: int, budget: int) -> str:
        self.budget_refusals += 1
        if hasattr(self.backend, "estimate_stream_bytes"):
            basis = f"the {self.backend.name} backend's estimate"
        else:
            basis = f"{self.bytes_model.per_token:.0f} bytes per token, measured on this stage's streams"
        return (
            f"request {seg.request_id}: {len(seg.tokens)} tokens need about {need} bytes of stream memory "
            f"({basis}), more than the whole {OPTION}={budget} bytes: it can never run on this stage; send a "
            "shorter reply or raise the budget"
        )

    def stream_bytes(self) -> list[StreamBytes]:
        """Memory of every live stream (own bytes vs. bytes shared with its voice)."""
        return [self.backend.stream_bytes(s.caches, s.voice) for s in self.store.states()]

    # ---- admission ----------------------------------------------------------------------------

    def _admit(self, seg: Segment) -> _Item:
        if seg.kind is SegmentKind.WHOLE:
            voice_key, voice = self.voice(seg.voice)
            seed = seg.seed if seg.seed is not None else self.noise_seed(seg.request_id, 0)
            if not seg.tokens:
                raise ChunkRejectedError(f"request {seg.request_id}: a whole utterance without speech tokens")
            check = getattr(self.backend, "check_whole", None)
            if check is not None:  # before any launch: a bad row must not fail a shared one
                try:
                    check(voice, seg.tokens)
                except ValueError as exc:
                    raise ChunkRejectedError(f"request {seg.request_id}: {exc}") from exc
            self.last_seeds[seg.key] = seed
            return _Item(seg, "whole", voice_key=voice_key, voice=voice, seed=seed)
        assert seg.chunk is not None
        previous = self.store.get(seg.key)
        adm = admit(seg.request_id, seg.chunk, seg.voice, previous, self.store.ended(seg.key))
        if adm.previous is None:
            voice_key, voice = self.voice(seg.voice)
            seed = seg.seed if seg.seed is not None else self.noise_seed(seg.request_id, adm.epoch)
            caches = self.backend.open_stream(voice, seed)
            self.last_seeds[seg.key] = seed
        else:
            voice_key, voice, caches = adm.previous.voice_key, adm.previous.voice, adm.previous.caches
        reserved = self._reserved.get(seg.key)
        reserve_stream = getattr(self.backend, "reserve_stream", None)
        if reserved is not None and reserve_stream is not None:
            caches = reserve_stream(caches, reserved)
        item = _Item(seg, "chunk", adm.epoch, adm.chunk_seq, voice_key, voice, caches, adm.previous)
        if seg.tokens:
            try:
                item.product = self.backend.shape(caches, seg.tokens, seg.chunk.last)
            except ValueError as exc:
                raise ChunkRejectedError(f"request {seg.request_id}: chunk_seq {adm.chunk_seq}: {exc}") from exc
        elif seg.chunk.last:
            item.kind = "flush" if adm.previous is not None else "end"
        else:
            item.kind = "advance"
        return item

    # ---- launches -------------------------------------------------------------------------------

    def _run_chunks(self, chunks: list[_Item]) -> None:
        if not chunks:
            self.last_plan = StepPlan()
            return
        plan = plan_step(
            [PlanItem(i, it.segment.request_id, it.product) for i, it in enumerate(chunks)],  # type: ignore[arg-type]
            max_rows=self.config.max_rows,
            pad_to_buckets=self.config.pad_to_buckets,
        )
        self.last_plan = plan
        for launch in plan.flow:
            self._launch(launch, chunks, self._flow)
        for launch in plan.vocoder:
            alive = tuple(r for r in launch.rows if chunks[r].error is None)
            if alive:
                self._launch(replace(launch, rows=alive), chunks, self._vocoder)

    def _run_wholes(self, wholes: list[_Item]) -> None:
        """Whole utterances: several per launch where the backend has `whole_rows`, else one `whole` call each."""
        if not wholes:
            return
        batched = callable(getattr(self.backend, "whole_rows", None))
        launches = plan_whole([len(it.segment.tokens) for it in wholes], max_rows=self.config.max_rows, batched=batched)
        names = {i: it.segment.request_id for i, it in enumerate(wholes)}
        self.last_plan = replace(self.last_plan, whole=launches, whole_names=names)
        self.whole_launches += len(launches)
        for launch in launches:
            if batched:
                self._launch(launch, wholes, self._whole)
            else:
                it = wholes[launch.rows[0]]
                self._guard(it, lambda it=it: self.backend.whole(it.voice, it.segment.tokens, it.seed))

    def _whole(self, rows: list[_Item], pad: int) -> None:
        works = [WholeWork(it.voice, it.segment.tokens, it.seed) for it in rows]
        outs = self.backend.whole_rows(works)  # type: ignore[attr-defined]  # optional method, checked by the caller
        if len(outs) != len(rows):
            raise RuntimeError(f"whole_rows returned {len(outs)} results for {len(rows)} rows")
        for it, audio in zip(rows, outs, strict=True):
            it.audio = audio

    def _flow(self, rows: list[_Item], pad: int) -> None:
        products = self.backend.run_flow([_work(it) for it in rows], pad)
        for it, product in zip(rows, products, strict=True):
            it.product = product

    def _vocoder(self, rows: list[_Item], pad: int) -> None:
        outs = self.backend.run_vocoder([_work(it) for it in rows], [it.product for it in rows], pad)
        for it, (audio, caches) in zip(rows, outs, strict=True):
            it.audio, it.new_caches = audio, caches

    def _launch(self, launch: Launch, chunks: list[_Item], run: Callable[[list[_Item], int], None]) -> None:
        rows = [chunks[r] for r in launch.rows]
        try:
            run(rows, launch.pad)
            return
        except Exception as exc:  # noqa: BLE001 - isolate the culprit below, whatever failed
            if len(rows) == 1:
                rows[0].error = _message(rows[0].segment, exc)
                logger.warning(
                    "token2wav stage: %s launch failed for request %s: %s", launch.kind, rows[0].segment.request_id, exc
                )
                return
            logger.warning(
                "token2wav stage: a %s launch of %d rows failed (%s: %s); re-running its rows one by one",
                launch.kind,
                len(rows),
                type(exc).__name__,
                exc,
            )
        for it in rows:
            try:
                run([it], 0)
            except Exception as exc:  # noqa: BLE001 - this row alone fails; the others keep their results
                it.error = _message(it.segment, exc)
                logger.warning("token2wav stage: request %s failed alone: %s", it.segment.request_id, exc)

    def _guard(self, it: _Item, compute: Callable[[], torch.Tensor]) -> None:
        try:
            it.audio = compute()
        except Exception as exc:  # noqa: BLE001 - one request's failure is its own result
            it.error = _message(it.segment, exc)

    # ---- commit -----------------------------------------------------------------------------------

    def _commit(self, items: list[_Item]) -> None:
        put: list[StreamState] = []
        end: list[tuple[str, Ended]] = []
        for it in items:
            seg = it.segment
            if it.error is not None or it.kind == "whole":
                continue
            assert seg.chunk is not None
            emitted = 0 if it.audio is None else int(it.audio.shape[-1])
            base = it.previous.samples_emitted if it.previous is not None else 0
            tokens = (it.previous.tokens if it.previous is not None else 0) + len(seg.tokens)
            if seg.chunk.last:
                self._reserved.pop(seg.key, None)
                end.append((seg.key, Ended(it.epoch, it.chunk_seq, f"had its last chunk (chunk_seq {it.chunk_seq})")))
                continue
            caches = it.new_caches if it.kind == "chunk" else it.caches
            put.append(
                StreamState(
                    key=seg.key,
                    request_id=seg.request_id,
                    epoch=it.epoch,
                    chunk_seq=it.chunk_seq,
                    voice_key=it.voice_key,
                    voice=it.voice,
                    caches=caches,
                    samples_emitted=base + emitted,
                    tokens=tokens,
                )
            )
        self.store.commit(put, end)
        if self.config.memory_budget is not None and not hasattr(self.backend, "estimate_stream_bytes"):
            for state in put:
                self.bytes_model.observe(state.tokens, self.backend.stream_bytes(state.caches, state.voice).own)


def _work(it: _Item) -> ChunkWork[Any]:
    assert it.segment.chunk is not None
    return ChunkWork(it.caches, it.segment.tokens, it.segment.chunk.last)


def _message(seg: Segment, exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    prefix = f"request {seg.request_id}"
    return text if text.startswith(prefix) else f"{prefix}: {type(exc).__name__}: {text}"


__all__ = ["REQUEST_ERRORS", "StepExecutorConfig", "Token2WavStepExecutor"]
