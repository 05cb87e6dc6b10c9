# SPDX-License-Identifier: Apache-2.0
"""The family-agnostic engine over a recording fake backend: batching, isolation, commit semantics, seeds.

The fake backend's "audio" is the chunk's tokens as floats and its caches are the tokens seen so
far, so every routing mistake (a row getting another row's audio, a failed row's state changing)
shows up as a wrong number. Launch failures are injected by a poison token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from vllm_omni_token2wav.model_executor.models.token2wav_stage.backend import (
    ChunkShape,
    ChunkWork,
    StreamBytes,
    WholeWork,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.contract import ChunkMeta, Segment, SegmentKind
from vllm_omni_token2wav.model_executor.models.token2wav_stage.step_executor import (
    StepExecutorConfig,
    Token2WavStepExecutor,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.store import StreamStore
from vllm_omni_token2wav.model_executor.models.token2wav_stage.voice import VoiceRequest

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

POISON_FLOW = 666
POISON_VOCODER = 777
VOICE = (np.sin(np.linspace(0, 300, 16000)).astype(np.float32) * 0.3, 16000)


@dataclass(frozen=True)
class FakeCaches:
    voice: str
    seed: int
    seen: tuple[int, ...] = ()


@dataclass
class FakeBackend:
    name: str = "fake"
    launches: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    voices: list[str] = field(default_factory=list)
    opened: list[int] = field(default_factory=list)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def ensure_loaded(self) -> None:
        pass

    def prepare_voice(self, key: str, wav_24k: np.ndarray) -> str:
        assert wav_24k.dtype == np.float32 and wav_24k.shape == (24000,)  # normalised to 1 s at 24 kHz
        self.voices.append(key)
        return key

    def open_stream(self, voice: object, seed: int) -> FakeCaches:
        self.opened.append(seed)
        return FakeCaches(str(voice), seed)

    def shape(self, caches: object, tokens: Sequence[int], last: bool) -> ChunkShape:
        if any(t < 0 for t in tokens):
            raise ValueError(f"negative token {min(tokens)}")
        return ChunkShape("flow", len(tokens), len(tokens), "voc" if not last else "voc-last")

    def run_flow(self, works: Sequence[ChunkWork], pad_frames: int) -> list[object]:
        self.launches.append(("flow", tuple(w.tokens[0] for w in works)))
        if any(POISON_FLOW in w.tokens for w in works):
            raise RuntimeError("flow kernel exploded")
        return [sum(w.tokens) for w in works]

    def run_vocoder(
        self, works: Sequence[ChunkWork], products: Sequence[object], pad_rows: int
    ) -> list[tuple[torch.Tensor, object]]:
        self.launches.append(("vocoder", tuple(w.tokens[0] for w in works)))
        if any(POISON_VOCODER in w.tokens for w in works):
            raise RuntimeError("vocoder kernel exploded")
        out = []
        for w, product in zip(works, products, strict=True):
            assert product == sum(w.tokens)  # the flow product of this very row
            caches = w.caches
            assert isinstance(caches, FakeCaches)
            out.append(
                (
                    torch.tensor(w.tokens, dtype=torch.float32),
                    FakeCaches(caches.voice, caches.seed, caches.seen + w.tokens),
                )
            )
        return out

    def flush(self, caches: object) -> torch.Tensor:
        assert isinstance(caches, FakeCaches)
        return torch.tensor([-1.0, float(len(caches.seen))])

    def whole(self, voice: object, tokens: Sequence[int], seed: int) -> torch.Tensor:
        return torch.tensor([float(seed % 1000), *map(float, tokens)])

    def stream_bytes(self, caches: object, voice: object) -> StreamBytes:
        assert isinstance(caches, FakeCaches)
        return StreamBytes(own=len(caches.seen), shared=0)


def _engine(**config: object) -> tuple[Token2WavStepExecutor, FakeBackend]:
    backend = FakeBackend()
    engine = Token2WavStepExecutor(
        backend,
        StreamStore(max_streams=16),
        VOICE,
        StepExecutorConfig(reference_seconds=1.0, **config),  # type: ignore[arg-type]
    )
    return engine, backend


def _seg(i: int, rid: str, seq: int | None, tokens: Sequence[int], last: bool = False, **kw: object) -> Segment:
    return Segment(i, rid, rid, SegmentKind.CHUNK, tuple(tokens), ChunkMeta(seq, kw.pop("epoch", None), last), **kw)  # type: ignore[arg-type]


def _audio(result: object) -> list[float]:
    return [] if result.audio is None else result.audio.tolist()  # type: ignore[attr-defined]


def test_one_step_batches_every_ready_chunk_and_routes_results_back() -> None:
    engine, backend = _engine()
    out = engine.step([_seg(0, "a", 0, [1, 2]), _seg(1, "b", 0, [3, 4, 5]), _seg(2, "c", 0, [6], last=True)])
    assert [_audio(r) for r in out] == [[1, 2], [3, 4, 5], [6]] and all(r.error is None for r in out)
    assert backend.launches == [("flow", (1, 3, 6)), ("vocoder", (1, 3)), ("vocoder", (6,))]
    assert len(engine.store) == 2 and engine.store.get("a").caches.seen == (1, 2)  # type: ignore[union-attr]
    assert engine.store.ended("c") is not None and "had its last chunk (chunk_seq 0)" in engine.store.ended("c").reason  # type: ignore[union-attr]
    assert backend.voices == ["default"]  # the default voice, prepared once for all three


def test_a_failing_flow_launch_is_rerun_row_by_row_and_only_the_culprit_fails() -> None:
    engine, backend = _engine()
    engine.step([_seg(0, "a", 0, [1]), _seg(1, "b", 0, [2]), _seg(2, "c", 0, [3])])
    before = engine.store.get("b")
    backend.launches.clear()
    out = engine.step([_seg(0, "a", 1, [10]), _seg(1, "b", 1, [POISON_FLOW]), _seg(2, "c", 1, [30])])
    assert _audio(out[0]) == [10] and _audio(out[2]) == [30]
    assert out[1].audio is None and out[1].error == "request b: RuntimeError: flow kernel exploded"
    assert backend.launches[:4] == [
        ("flow", (10, POISON_FLOW, 30)),
        ("flow", (10,)),
        ("flow", (POISON_FLOW,)),
        ("flow", (30,)),
    ]
    assert ("vocoder", (10, 30)) in backend.launches  # the survivors still share their vocoder launch
    assert engine.store.get("b") is before  # untouched: its next chunk is still chunk 1
    assert engine.store.get("a").chunk_seq == 1 and engine.store.get("c").caches.seen == (3, 30)  # type: ignore[union-attr]
    retry = engine.step([_seg(0, "b", 1, [20])])
    assert _audio(retry[0]) == [20] and engine.store.get("b").caches.seen == (2, 20)  # type: ignore[union-attr]


def test_a_failing_vocoder_launch_is_isolated_too() -> None:
    engine, _ = _engine()
    out = engine.step([_seg(0, "a", 0, [1]), _seg(1, "b", 0, [POISON_VOCODER])])
    assert _audio(out[0]) == [1] and out[1].error == "request b: RuntimeError: vocoder kernel exploded"
    assert engine.store.get("b") is None and engine.store.get("a") is not None


def test_rejected_segments_fail_alone_with_their_reason() -> None:
    engine, backend = _engine()
    engine.step([_seg(0, "a", 0, [1]), _seg(1, "b", 0, [2])])
    out = engine.step(
        [
            _seg(0, "a", 3, [5]),  # skipped chunk
            _seg(1, "b", 1, [-4]),  # the backend refuses the chunk's shape
            _seg(2, "b", 1, [6]),  # a second segment of b in one step
            _seg(3, "new", 2, [7]),  # a first chunk that is not chunk 0
            Segment(4, "x", "x", SegmentKind.PLACEHOLDER, error="request x: unreadable"),
            Segment(5, "p", "p", SegmentKind.PLACEHOLDER),
        ]
    )
    assert out[0].error == "request a: skipped chunk: expected chunk_seq 1 (epoch 0), got 3"
    assert out[1].error == "request b: chunk_seq 1: negative token -4"
    assert (
        out[2].error is not None
        and "a second segment of this request in one step (the first is segment 1)" in out[2].error
    )
    assert out[3].error is not None and "must have chunk_seq 0, got 2" in out[3].error
    assert out[4].error == "request x: unreadable" and out[5].error is None and out[5].audio is None
    assert engine.store.get("a").chunk_seq == 0 and engine.store.get("b").chunk_seq == 0  # type: ignore[union-attr]
    assert engine.store.get("new") is None


def test_empty_chunks_flush_the_held_tail_or_just_advance() -> None:
    engine, _ = _engine()
    engine.step([_seg(0, "a", 0, [1, 2, 3]), _seg(1, "b", 0, [4])])
    out = engine.step([_seg(0, "a", 1, []), _seg(1, "b", 1, [], last=True), _seg(2, "c", 0, [], last=True)])
    assert out[0].audio is None and out[0].error is None and engine.store.get("a").chunk_seq == 1  # type: ignore[union-attr]
    assert _audio(out[1]) == [-1.0, 1.0] and engine.store.get("b") is None  # the tail of a 1-token stream
    assert out[2].audio is None and out[2].error is None and engine.store.ended("c") is not None


def test_a_new_epoch_restarts_and_a_failed_restart_keeps_the_old_stream() -> None:
    engine, backend = _engine()
    engine.step([_seg(0, "a", 0, [1])])
    old = engine.store.get("a")
    out = engine.step([_seg(0, "a", 0, [POISON_FLOW], epoch=1)])
    assert out[0].error is not None and engine.store.get("a") is old
    engine.step([_seg(0, "a", 0, [9], epoch=1)])
    new = engine.store.get("a")
    assert new is not None and (new.epoch, new.caches.seen) == (1, (9,))  # type: ignore[attr-defined]


def test_noise_seeds_come_from_the_request_and_epoch_unless_sent() -> None:
    engine, backend = _engine(seed=5)
    engine.step([_seg(0, "a", 0, [1]), _seg(1, "b", 0, [2]), _seg(2, "c", 0, [3], seed=42)])
    again, backend2 = _engine(seed=5)
    again.step([_seg(0, "b", 0, [2]), _seg(1, "a", 0, [1])])
    assert backend.opened[:2] == [backend2.opened[1], backend2.opened[0]]  # same request -> same seed, any batch
    assert backend.opened[2] == 42 and len(set(backend.opened)) == 3
    assert engine.noise_seed("a", 0) != engine.noise_seed("a", 1) != _engine(seed=6)[0].noise_seed("a", 1)


def test_voices_are_prepared_once_per_key() -> None:
    engine, backend = _engine()
    alice = VoiceRequest(key="ref:alice", label="alice", source=VOICE)
    engine.step([_seg(0, "a", 0, [1], voice=alice), _seg(1, "b", 0, [2], voice=alice), _seg(2, "c", 0, [3])])
    assert backend.voices == ["ref:alice", "default"]
    assert engine.store.get("a").caches.voice == "ref:alice" and engine.store.get("c").caches.voice == "default"  # type: ignore[union-attr]


def test_whole_utterances_run_alone_without_state() -> None:
    engine, backend = _engine()
    whole = Segment(0, "w", "w", SegmentKind.WHOLE, (4, 5))
    out = engine.step([whole, _seg(1, "a", 0, [1])])
    seed = engine.noise_seed("w", 0)
    assert _audio(out[0]) == [float(seed % 1000), 4.0, 5.0] and len(engine.store) == 1
    empty = engine.step([Segment(0, "w2", "w2", SegmentKind.WHOLE, ())])
    assert empty[0].error == "request w2: a whole utterance without speech tokens"


@dataclass
class BatchingWholeBackend(FakeBackend):
    """A backend with `whole_rows`: several whole utterances per launch (a poisoned row fails the launch)."""

    def check_whole(self, voice: object, tokens: Sequence[int]) -> None:
        if any(t < 0 for t in tokens):
            raise ValueError(f"negative token {min(tokens)}")

    def whole_rows(self, works: Sequence[WholeWork]) -> list[torch.Tensor]:
        self.launches.append(("whole", tuple(w.tokens[0] for w in works)))
        if any(POISON_FLOW in w.tokens for w in works):
            raise RuntimeError("whole kernel exploded")
        return [self.whole(w.voice, w.tokens, w.seed) for w in works]


def test_whole_utterances_share_launches_of_at_most_max_rows_and_a_failure_is_rerun_row_by_row() -> None:
    backend = BatchingWholeBackend()
    engine = Token2WavStepExecutor(
        backend, StreamStore(max_streams=16), VOICE, StepExecutorConfig(reference_seconds=1.0, max_rows=3)
    )
    wholes = [Segment(i, f"w{i}", f"w{i}", SegmentKind.WHOLE, (10 + i, i)) for i in range(4)]
    out = engine.step([*wholes, _seg(4, "a", 0, [1])])
    assert backend.launches == [("flow", (1,)), ("vocoder", (1,)), ("whole", (10, 11, 12)), ("whole", (13,))]
    assert [_audio(r)[1:] for r in out[:4]] == [[10.0 + i, float(i)] for i in range(4)]
    assert engine.whole_launches == 2 and [launch.rows for launch in engine.last_plan.whole] == [(0, 1, 2), (3,)]
    assert "whole    3 rows      6 tokens +0    key=whole  [w0, w1, w2]" in engine.last_plan.describe()

    backend.launches.clear()
    poisoned = Segment(1, "p", "p", SegmentKind.WHOLE, (20, POISON_FLOW))
    out = engine.step([wholes[0], poisoned, wholes[2]])
    assert backend.launches == [("whole", (10, 20, 12)), ("whole", (10,)), ("whole", (20,)), ("whole", (12,))]
    assert out[1].error is not None and "whole kernel exploded" in out[1].error
    assert _audio(out[0])[1:] == [10.0, 0.0] and _audio(out[2])[1:] == [12.0, 2.0]

    backend.launches.clear()  # what `check_whole` refuses never reaches a launch
    out = engine.step([wholes[0], Segment(1, "n", "n", SegmentKind.WHOLE, (30, -4)), wholes[2]])
    assert backend.launches == [("whole", (10, 12))] and out[1].error == "request n: negative token -4"


def test_without_whole_rows_each_whole_utterance_is_its_own_launch() -> None:
    engine, backend = _engine()
    out = engine.step([Segment(i, f"w{i}", f"w{i}", SegmentKind.WHOLE, (i + 1,)) for i in range(3)])
    assert all(r.error is None for r in out) and engine.whole_launches == 3
    assert [launch.rows for launch in engine.last_plan.whole] == [(0,), (1,), (2,)]
