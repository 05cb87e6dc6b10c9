# SPDX-License-Identifier: Apache-2.0
"""The Token2Wav RTF benchmark library and its recorder (`record.py token2wav_rtf`), on the reduced stand-in.

One short in-process run (reduced stand-in, 30 tokens, 2 Euler steps, one run) checks the
report's shape and honesty (documented fields, finite positive timings, a split that adds up, the
reference chunking, the right audio length); the component clock, the summaries and the config
checks are tested on small hand-built inputs, and the recorder on a stand-in of the CLI.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.helpers.recorder import NamedRecorder, recorder
from vllm_omni_token2wav.benchmarks.token2wav.report import plot_png, render_text, report_json
from vllm_omni_token2wav.benchmarks.token2wav.run import (
    COMPONENTS,
    PROMPT_CASES,
    SCHEMA,
    BenchConfig,
    BenchReport,
    ModeResult,
    PromptCase,
    SynthesisRun,
    Token2WavBenchmark,
    _ComponentClock,
)
from vllm_omni_token2wav.model_executor.models.token2wav_core.stream import stream_chunks

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
GEN_TOKENS = 30  # 1.2 s: one full chunk (25 + 3 lookahead) and a short final chunk


@pytest.fixture(scope="module")
def report() -> BenchReport:
    config = BenchConfig(
        reduced=True,
        device="cpu",
        gen_seconds=GEN_TOKENS / 25,
        prompt_seconds=1.0,
        n_timesteps=2,
        runs=1,
        warmup=0,
        prompt_calls=3,
        threads=1,
        plan="fast",
    )
    return Token2WavBenchmark(config).run()


@pytest.fixture(scope="module")
def document(report: BenchReport) -> dict[str, Any]:
    return json.loads(report_json(report))


def test_report_has_the_documented_fields(document: dict[str, Any]) -> None:
    assert document["schema"] == SCHEMA and document["complete"] is True
    for key in ("config", "environment", "weights", "backends", "load_s", "prompt_prep", "synthesis", "components"):
        assert key in document
    assert document["components"] == list(COMPONENTS)
    assert document["weights"]["kind"] == "stand-in (reduced size)"
    assert document["config"]["gen_tokens"] == GEN_TOKENS and document["config"]["n_timesteps"] == 2
    assert document["environment"]["device"] == "cpu" and document["environment"]["threads"] == 1
    assert [case["case"] for case in document["prompt_prep"]] == list(PROMPT_CASES)
    modes = {m["mode"]: m for m in document["synthesis"]}
    assert set(modes) == {"whole", "stream"}
    for mode in modes.values():
        for key in (
            "median_total_s",
            "rtf",
            "rtf_after_setup",
            "median_first_audio_s",
            "split_of_median_run_s",
            "runs",
        ):
            assert key in mode
        assert set(mode["split_of_median_run_s"]) == set(COMPONENTS)


def test_timings_are_finite_and_positive(document: dict[str, Any]) -> None:
    modes = {m["mode"]: m for m in document["synthesis"]}
    for mode in modes.values():
        assert mode["median_total_s"] > 0 and math.isfinite(mode["rtf"]) and mode["rtf"] > 0
        assert 0 < mode["rtf_after_setup"] < mode["rtf"]
        split = mode["split_of_median_run_s"]
        assert all(split[name] >= 0 for name in COMPONENTS)
        assert split["prompt"] > 0 and split["flow"] > 0 and split["vocoder"] > 0
    assert modes["whole"]["split_of_median_run_s"]["flow_setup"] == 0.0  # whole utterances set up no stream
    stream = modes["stream"]
    assert stream["split_of_median_run_s"]["flow_setup"] > 0
    assert stream["median_setup_s"] > 0 and stream["median_first_chunk_s"] > 0
    assert stream["median_first_audio_s"] == pytest.approx(stream["median_setup_s"] + stream["median_first_chunk_s"])
    for case in document["prompt_prep"]:
        assert case["median_ms"] > 0 and case["p90_ms"] >= case["median_ms"] and case["calls"] == 3


def test_component_split_adds_up_to_the_run_total(report: BenchReport) -> None:
    for mode in report.modes:
        for run in mode.runs:
            measured = sum(v for k, v in run.components_s.items() if k != "other")
            assert measured <= run.total_s * 1.001  # the clock only sees calls inside the timed request
            assert sum(run.components_s.values()) == pytest.approx(run.total_s, rel=1e-9)
    stream = report.mode("stream")
    assert stream is not None
    for run in stream.runs:
        assert run.chunks_s is not None and run.chunk_components_s is not None
        for seconds, parts in zip(run.chunks_s, run.chunk_components_s, strict=True):
            assert sum(parts.values()) == pytest.approx(seconds, rel=1e-9)
            assert parts["flow"] > 0 and parts["vocoder"] > 0 and parts["prompt"] == 0.0


def test_streaming_follows_the_reference_chunking_and_audio_length(report: BenchReport) -> None:
    expected_chunks = len(list(stream_chunks(list(range(GEN_TOKENS)))))
    stream, whole = report.mode("stream"), report.mode("whole")
    assert stream is not None and whole is not None
    assert [len(run.chunks_s or []) for run in stream.runs] == [expected_chunks]
    for run in stream.runs + whole.runs:
        assert run.samples == GEN_TOKENS * 2 * 480


def test_speaker_paths_are_named_and_the_cache_hit_is_cheapest(report: BenchReport) -> None:
    cases = {c.case: c for c in report.prompt_cases}
    assert cases["ort"].backend == "onnxruntime-cpu"
    assert cases["device"].backend.startswith("torch-cpu")  # the CPU policy keeps ORT: torch measured explicitly
    assert "measured explicitly" in cases["device"].note
    assert cases["cached"].median_ms < min(cases["ort"].median_ms, cases["device"].median_ms)


def test_table_and_plot_render(report: BenchReport) -> None:
    text = render_text(report)
    for needle in ("whole", "stream", "RTF", "1st chunk", "STAND-IN", "prompt preparation", "flow / vocoder / other"):
        assert needle in text
    assert "PARTIAL" not in text
    assert plot_png(report).startswith(PNG_SIGNATURE)


def _run(total: float, *, setup: float | None = None, chunks: list[float] | None = None) -> SynthesisRun:
    components = dict.fromkeys(COMPONENTS, 0.0)
    components["flow"] = total
    return SynthesisRun(total_s=total, components_s=components, samples=960, setup_s=setup, chunks_s=chunks)


def test_summary_uses_medians_and_the_split_of_the_median_run() -> None:
    whole = ModeResult("whole", audio_seconds=2.0, runs=[_run(4.0), _run(9.0), _run(2.0)])
    for run, prompt in zip(whole.runs, (1.0, 1.0, 0.5), strict=True):
        run.components_s["prompt"] = prompt
    s = whole.summary()
    assert s["median_total_s"] == 4.0 and s["rtf"] == 2.0 and s["rtf_after_setup"] == 1.5
    assert s["split_of_median_run_s"]["flow"] == 4.0  # the run with the median total, not per-part medians
    stream = ModeResult(
        "stream",
        audio_seconds=2.0,
        runs=[_run(5.0, setup=2.0, chunks=[2.0, 1.0]), _run(7.0, setup=3.0, chunks=[3.0, 1.0])],
    )
    s = stream.summary()
    assert s["median_setup_s"] == 2.5 and s["median_first_chunk_s"] == 2.5
    assert s["median_first_audio_s"] == 5.0 and s["median_chunks_s"] == [2.5, 1.0]
    assert s["rtf_after_setup"] == pytest.approx(3.5 / 2.0)  # median of (5 - 2, 7 - 3) over 2 s of audio


def test_prompt_case_p90_is_an_observed_call() -> None:
    case = PromptCase("ort", "onnxruntime-cpu", [float(v) for v in range(1, 11)])
    assert case.median_ms == 5.5 and case.p90_ms == 9.0


class _FakeFlow(nn.Module):
    def inference(self, x: float) -> float:
        time.sleep(0.02)
        return x

    def inference_chunk(self, x: float) -> float:
        time.sleep(0.01)
        return x

    def setup_cache(self, x: float) -> float:
        return x


class _FakeStreamVocoder:
    def __init__(self, hift: nn.Module) -> None:
        self.hift = hift

    def vocode(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.02)
        return self.hift(x)  # a HiFT forward inside a vocoder launch is billed once, with the launch


class _FakeCore:
    def __init__(self) -> None:
        self.flow = _FakeFlow()
        self.hift = nn.Identity()
        self.stream_vocoder = _FakeStreamVocoder(self.hift)

    def prepare_prompt(self, x: float) -> float:
        time.sleep(0.01)
        return x


def test_component_clock_bills_each_call_and_removes_its_wrappers() -> None:
    core = _FakeCore()
    syncs: list[int] = []
    with _ComponentClock(core, lambda: syncs.append(1)) as clock:
        core.prepare_prompt(1.0)
        core.flow.inference(1.0)
        core.flow.inference_chunk(1.0)
        core.hift(torch.zeros(1))
        whole_vocoder = clock.seconds["vocoder"]
        core.stream_vocoder.vocode(torch.zeros(1))
    assert clock.seconds["prompt"] >= 0.01 and clock.seconds["flow"] >= 0.03 and whole_vocoder > 0
    assert clock.seconds["vocoder"] - whole_vocoder >= 0.02
    assert clock.seconds["flow_setup"] == 0.0
    assert len(syncs) == 10  # before and after each of the five timed calls (not the HiFT inside the launch)
    assert "vocode" not in vars(core.stream_vocoder)
    assert not {"inference", "inference_chunk", "setup_cache"} & set(vars(core.flow))
    assert "prepare_prompt" not in vars(core)
    assert not core.hift._forward_hooks and not core.hift._forward_pre_hooks


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_dir": Path("/x"), "reduced": True}, "reduced"),
        ({"gen_seconds": 0.01}, "gen_seconds"),
        ({"prompt_seconds": 20.0}, "prompt_seconds"),
        ({"runs": 0}, "runs"),
        ({"n_timesteps": 0}, "n_timesteps"),
        ({"threads": 0}, "threads"),
    ],
)
def test_config_rejects_unusable_sizes(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BenchConfig(**changes).validate()


def _recorder() -> NamedRecorder:
    return recorder("token2wav_rtf")


def test_recorder_runs_the_cli_and_keeps_its_three_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[list[str]] = []

    def fake_cli(args: list[str]) -> int:
        seen.append(args)
        Path(args[args.index("--json") + 1]).write_text("{}")
        Path(args[args.index("--plot") + 1]).write_bytes(PNG_SIGNATURE)
        print("the table")
        return 0

    monkeypatch.setattr("vllm_omni_token2wav.entrypoints.cli.main.main", fake_cli)
    code = _recorder().main(["--reduced", "--device", "cpu", "--results-dir", str(tmp_path)])
    assert code == 0
    stem = tmp_path / "token2wav_rtf_cpu"
    assert seen == [
        ["bench", "token2wav", "--reduced", "--device", "cpu", "--json", f"{stem}.json", "--plot", f"{stem}.png"]
    ]
    assert Path(f"{stem}.txt").read_text() == "the table\n"
    assert "the table" in capsys.readouterr().out
