# SPDX-License-Identifier: Apache-2.0
"""The concurrency benchmark's arithmetic: percentiles, playback underruns, talker timing, workloads, ratios."""

from __future__ import annotations

import pytest

from vllm_omni_token2wav.benchmarks.token2wav_serve.run import (
    ModeRun,
    RequestResult,
    ServeConfig,
    arrivals,
    make_requests,
    percentiles,
    ratio_row,
    ready_offsets,
    talker_bound,
)
from vllm_omni_token2wav.model_executor.models.standin.chunk_producer import ProducerStream, all_chunks
from vllm_omni_token2wav.model_executor.models.token2wav_stage.families import MINICPMO_4_5, STEP_AUDIO2

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentiles(values) == {"p50": 50.0, "p90": 90.0, "p99": 99.0, "mean": 50.5}
    assert percentiles([3.0]) == {"p50": 3.0, "p90": 3.0, "p99": 3.0, "mean": 3.0}
    assert percentiles([])["p50"] is None


def test_playback_counts_chunks_that_arrive_after_the_audio_ran_out() -> None:
    r = RequestResult("r", 0, 75, arrival_s=1.0, admitted_s=1.0)
    # 1 s of audio at t=2 (plays until 3), 1 s at 2.5 (in time, plays until 4), 0.5 s at 4.7 (0.7 s stall).
    r.deliveries = [(2.0, 24000), (2.5, 24000), (4.7, 12000)]
    assert r.ttfp_s() == 1.0 and r.audio_s == 2.5
    assert r.rtf() == pytest.approx((4.7 - 1.0) / 2.5)
    underruns, stall = r.playback()
    assert underruns == 1 and stall == pytest.approx(0.7)
    late_first = RequestResult("q", 0, 1, 0.0, 0.0, deliveries=[(0.5, 0), (1.0, 4800)])
    assert late_first.ttfp_s() == 1.0 and late_first.playback() == (0, 0.0)  # an empty chunk is no audio


def test_chunks_are_ready_when_the_talker_has_emitted_their_last_token() -> None:
    for family, name in ((MINICPMO_4_5, "minicpmo_4_5"), (STEP_AUDIO2, "step_audio2")):
        tokens = list(range(90))
        chunks = all_chunks(ProducerStream("r", tokens, family))
        offsets = ready_offsets(chunks, len(tokens), 100.0, name)
        # Replay the talker token by token: each chunk appears exactly when its offset says.
        replay, appeared = ProducerStream("r", tokens, family), {}
        for emitted in range(1, len(tokens) + 1):
            while (c := replay.next_chunk(emitted, emitted == len(tokens))) is not None:
                appeared[c.chunk_seq] = emitted / 100.0
        assert [appeared[c.chunk_seq] for c in chunks] == pytest.approx(offsets), name
        assert offsets == sorted(offsets) and offsets[-1] == 0.9


def test_both_modes_get_the_same_workload_and_arrivals_are_seeded() -> None:
    config = ServeConfig(audio_seconds=(1.0, 3.0), seed=3, request_rate=2.0)
    a = make_requests(config, MINICPMO_4_5, 4, "x", pool=[])
    b = make_requests(config, MINICPMO_4_5, 4, "y", pool=[])
    assert [r.result.tokens for r in a] == [r.result.tokens for r in b] and len(a) == 12
    assert [c.tokens for r in a for c in r.chunks] == [c.tokens for r in b for c in r.chunks]
    assert all(25 <= r.result.tokens <= 75 for r in a)
    times = arrivals(config, 5, 4)
    assert times == arrivals(config, 5, 4) and times == sorted(times) and len(times) == 5  # type: ignore[arg-type]
    assert arrivals(ServeConfig(), 5, 4) is None  # closed loop


def test_ratio_row_divides_batched_by_unbatched() -> None:
    batched, unbatched = ModeRun("batched"), ModeRun("unbatched")
    for run, (t0, seconds) in ((batched, (0.5, 2.0)), (unbatched, (1.0, 4.0))):
        run.requests = [RequestResult("r", 0, 50, 0.0, 0.0, deliveries=[(t0, 24000), (seconds, 24000)])]
        run.makespan_s = seconds
    ratio = ratio_row(batched.summary(), unbatched.summary())
    assert ratio["throughput_audio_s_per_s"] == pytest.approx(2.0)
    assert ratio["ttfp_s_p50"] == pytest.approx(0.5) and ratio["rtf_p50"] == pytest.approx(0.5)
    assert ratio["stall_s_p90"] == pytest.approx(0.5 / 2.0)  # 1 s of audio ran out at 1.5 s and at 2 s
    for run in (batched, unbatched):
        run.requests[0].deliveries = [(1.0, 48000)]
    assert ratio_row(batched.summary(), unbatched.summary())["stall_s_p90"] is None  # no stalls: nothing to divide


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"family": "cosyvoice3"}, "family must be one of"),
        ({"concurrency": (0,)}, "concurrency levels must be >= 1"),
        ({"audio_seconds": (3.0, 1.0)}, "audio_seconds must be"),
        ({"talker_rate": 0.0}, "must be > 0"),
        ({"clock": "tsc"}, "clock must be one of"),
        ({"clock": "cpu", "threads": 2}, "the cpu clock needs --device cpu and 1 thread"),
        ({"clock": "cpu", "device": "cuda"}, "the cpu clock needs --device cpu and 1 thread"),
    ],
)
def test_config_is_validated(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ServeConfig(**kwargs).validate()


def test_poisson_arrivals_queue_beyond_the_concurrency_and_both_modes_serve_everything() -> None:
    """A tiny in-process run (reduced stand-in, smoke sizes) with Poisson arrivals faster than service."""
    from vllm_omni_token2wav.benchmarks.token2wav_serve.run import PLANS, Token2WavServeBenchmark

    sizes = {**PLANS["smoke"], "concurrency": (2,), "requests": 4}
    config = ServeConfig(device="cpu", request_rate=50.0, family="step_audio2", plan="smoke", **sizes)
    report = Token2WavServeBenchmark(config).run()
    assert report.complete and report.environment["loadavg_end"] is not None
    for mode in ("batched", "unbatched"):
        run = report.runs[(2, mode)]
        assert [r.errors for r in run.requests] == [[]] * 4 and all(r.samples > 0 for r in run.requests)
        times = arrivals(config, 4, 2)
        assert [r.arrival_s for r in run.requests] == times  # arrivals are the Poisson times ...
        assert all(r.admitted_s >= r.arrival_s for r in run.requests)  # ... and a request waits for a slot
        assert max(r.admitted_s - r.arrival_s for r in run.requests) > 0  # 50 req/s outpaces 2 slots
        assert all(r.ttfp_s() >= r.admitted_s - r.arrival_s for r in run.requests)  # type: ignore[operator]
    assert report.to_dict()["levels"][0]["ratio_batched_over_unbatched"]["throughput_audio_s_per_s"] > 0


def test_talker_bound_caps_either_modes_throughput() -> None:
    """c requests whose talkers emit T codes/s cannot get more than c x T / 25 audio seconds per second."""
    assert talker_bound(8, 100.0) == 32.0 and talker_bound(1, 25.0) == 1.0


def test_cpu_clock_counts_this_threads_work_and_not_time_it_waited() -> None:
    """The cpu clock is the thread's CPU time: a sleep (the core taken away) adds nothing, work does."""
    import time

    from vllm_omni_token2wav.benchmarks.token2wav_serve.run import CLOCKS

    cpu = CLOCKS["cpu"]
    start = cpu()
    time.sleep(0.2)
    slept = cpu() - start
    # Spin until the clock has counted 50 ms of work; a generous wall limit (a loaded host takes the
    # core away) only keeps a broken clock from hanging the test.
    start = cpu()
    deadline = time.perf_counter() + 30.0
    while cpu() - start < 0.05 and time.perf_counter() < deadline:
        pass
    busy = cpu() - start
    assert slept < 0.02 and busy >= 0.05
