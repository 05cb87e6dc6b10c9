# SPDX-License-Identifier: Apache-2.0
"""The device check: the CPU smoke run of the one command, its graph path, and the runner's rules.

`python benchmarks/device_check.py --device cpu --smoke` runs here exactly as a device session runs
it (subprocess, repository checkout, nothing installed beyond the venv), so the script never rots;
an in-process smoke run with the fake graph runtime covers the graph-replay rows that a CPU host
otherwise runs eagerly. The runner's rules (deadline skip, cooperative stop, hard timeout, errors
that do not stop the check, incremental atomic writes, the watchdog) are tested on small sections.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.fake_device_graphs import fake_graph_api
from vllm_omni_token2wav.benchmarks.device_check import run as dc
from vllm_omni_token2wav.benchmarks.device_check.campplus import agreement, percentile
from vllm_omni_token2wav.benchmarks.device_check.cli import SUBCOMMAND, default_out_dir
from vllm_omni_token2wav.benchmarks.device_check.stage import resampler
from vllm_omni_token2wav.entrypoints.cli.main import main as cli_main

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

REPO = Path(__file__).resolve().parents[3]
SECTION_NAMES = [
    "machine",
    "assets",
    "campplus_parity",
    "campplus_latency",
    "fbank",
    "stage_assets",
    "prompt_path",
    "token2wav",
    "cosyvoice3_assets",
    "cosyvoice3",
    "graphs",
]
#: What the accelerator images lack (phase-1 notes): the smoke run imports neither.
ABSENT_ON_ACCELERATOR_IMAGES = ("soxr", "soundfile")
#: Not on the accelerator image either, and the check must not even try them: an attempt leaves a trace.
ENGINE_PACKAGES = ("vllm", "vllm_omni")


def _without_modules(root: Path, names: tuple[str, ...], trace: Path | None = None) -> Path:
    """A folder of packages whose import fails like a missing install (prepend it to PYTHONPATH); with `trace`,
    each import attempt also appends the package's name to that file."""
    for name in names:
        package = root / name
        package.mkdir(parents=True, exist_ok=True)
        record = "" if trace is None else f"open({str(trace)!r}, 'a').write({name!r} + '\\n')\n"
        (package / "__init__.py").write_text(
            record + f"raise ImportError(\"No module named '{name}' (blinded by the test)\")\n"
        )
    return root


ENGINE_TRACE = "engine_imports.txt"


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The script as an accelerator session runs it: a subprocess, nothing installed, no soxr / soundfile."""
    out = tmp_path_factory.mktemp("device_check")
    blind = _without_modules(tmp_path_factory.mktemp("blind"), ABSENT_ON_ACCELERATOR_IMAGES)
    _without_modules(blind, ENGINE_PACKAGES, trace=out / ENGINE_TRACE)
    env = dict(os.environ, VLLM_OMNI_TOKEN2WAV_PLATFORM="cpu", PYTHONPATH=f"{blind}{os.pathsep}{REPO}")
    env.pop("OUT", None)
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "device_check.py"),
            "--device",
            "cpu",
            "--smoke",
            "--out-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=480,
        cwd=out,
        env=env,
    )
    return done, out


def test_cpu_smoke_run_of_the_script_completes_every_section(smoke_run: tuple[Any, Path]) -> None:
    done, out = smoke_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads((out / dc.JSON_NAME).read_text())
    assert document["schema"] == dc.SCHEMA and document["complete"] is True and document["aborted"] is None
    assert list(document["sections"]) == SECTION_NAMES
    statuses = {name: entry["status"] for name, entry in document["sections"].items()}
    assert set(statuses.values()) == {"ok"}, statuses
    assert (out / dc.TEXT_NAME).read_text() in done.stdout  # the printed table is the recorded one
    assert (out / dc.PLOT_NAME).read_bytes().startswith(b"\x89PNG")
    assert document["elapsed_s"] < document["config"]["deadline_s"]


def test_the_check_imports_neither_vllm_nor_vllm_omni(smoke_run: tuple[Any, Path]) -> None:
    """The accelerator image has no engine and cannot install one: not a single import attempt of either."""
    done, out = smoke_run
    assert done.returncode == 0, done.stderr[-3000:]
    trace = out / ENGINE_TRACE
    assert not trace.exists(), f"the device check tried to import {trace.read_text().split()}"


def test_the_cosyvoice3_section_reports_accuracy_chunk_cost_memory_and_concurrency(
    smoke_run: tuple[Any, Path],
) -> None:
    _, out = smoke_run
    sections = json.loads((out / dc.JSON_NAME).read_text())["sections"]
    assets = sections["cosyvoice3_assets"]["result"]
    assert assets["kind"] == "stand-in (reduced size)" and assets["bytes"] > 0
    cv3 = sections["cosyvoice3"]["result"]
    assert cv3["flow_dtype"] == {"float32": "float32", "reduced": "float16"}
    accuracy = {row["arm"]: row for row in cv3["accuracy"]["rows"]}
    assert set(accuracy) == {"float32 graphs", "reduced eager"} and cv3["accuracy"]["peak"] > 0
    # a CPU has no graph runtime: the "graphs" arm runs eagerly, so it must be the reference exactly
    assert accuracy["float32 graphs"]["whole"]["max_abs"] == 0.0 and accuracy["float32 graphs"]["chunks"] >= 2
    reduced = accuracy["reduced eager"]["whole"]
    assert 0 < reduced["log_mel_rel_l2"] < 0.5 and reduced["max_abs"] > 0  # fp16 differs, the spectrum stays close
    per_chunk = cv3["per_chunk"]["rows"]
    for precision in ("float32", "reduced"):
        rows = [r for r in per_chunk if r["precision"] == precision]
        assert [r["chunk"] for r in rows if not r["last"]] == [1, 2, 3] and rows[-1]["last"], rows
        assert all(r["ms"] > 0 for r in rows)
        grown = [r["kv_bytes_per_audio_s"] for r in rows if not r["last"] and r["chunk"] > 1]
        assert grown and all(g > 0 for g in grown)
    fp32 = [r["kv_bytes_per_audio_s"] for r in per_chunk if r["precision"] == "float32" and r["chunk"] == 3]
    half = [r["kv_bytes_per_audio_s"] for r in per_chunk if r["precision"] == "reduced" and r["chunk"] == 3]
    assert half[0] < 0.75 * fp32[0]  # the K/V arena follows the flow's dtype: about half the bytes
    levels = {(r["concurrency"], r["precision"], r["graphs"]) for r in cv3["rows"]}
    assert levels == {(c, p, g) for c in (1, 2) for p, g in (("reduced", True), ("reduced", False), ("float32", True))}
    for row in cv3["rows"]:
        assert not row["stopped"] and row["audio_s"] > 0 and row["throughput_audio_s_per_s"] > 0
        assert row["ttfp_p50_s"] > 0 and row["replays"] == 0


def test_smoke_report_holds_honest_measurements(smoke_run: tuple[Any, Path]) -> None:
    _, out = smoke_run
    sections = json.loads((out / dc.JSON_NAME).read_text())["sections"]
    machine = sections["machine"]["result"]
    assert machine["device"]["device"] == "cpu" and machine["torch"]["version"]
    assert machine["packages"]["onnxruntime"] and machine["host"]["usable_cores"] >= 1
    parity = sections["campplus_parity"]["result"]["rows"]
    assert {(r["frames"], r["backend"]) for r in parity} == {
        (t, b) for t in (97, 200) for b in ("torch-eager", "torch-graph")
    }
    for row in parity:  # the full-size stand-in on CPU: the project's documented torch tolerance
        assert row["cosine"] > 0.99999 and row["max_abs"] <= 1e-4 and row["ref_rms"] > 0.1
    latency = sections["campplus_latency"]["result"]["rows"]
    backends = {r["backend"] for r in latency}
    assert backends == {"onnxruntime-cpu-1t", "torch-eager", "torch-graph", "graph-replay"}
    for row in latency:
        assert row["n"] >= 1 and 0 < row["min_ms"] <= row["p50_ms"] <= row["p99_ms"]
    fbank = sections["fbank"]["result"]["rows"]
    assert fbank and fbank[0]["max_abs"] <= 1e-4
    machine_packages = machine["packages"]
    for name in ABSENT_ON_ACCELERATOR_IMAGES:  # really blind: the packages cannot be imported
        assert machine_packages[name] is None or machine_packages[name].startswith("import failed"), name
    assert sections["stage_assets"]["result"]["weights"]["kind"] == "stand-in (reduced size)"
    prompt = sections["prompt_path"]["result"]
    assert prompt["resampler"].startswith("scipy.signal.resample_poly")
    assert {r["backend"] for r in prompt["rows"]} == {
        "onnxruntime-cpu-1t",
        "torch-eager",
        "torch-graph",
        "torch-graph+tokens",
    }
    stage = sections["token2wav"]["result"]
    runs = {(r["kind"], r["concurrency"], r["graphs"]): r for r in stage["rows"]}
    assert set(runs) == {(k, c, g) for k in ("stream", "whole") for c in (1, 2) for g in (True, False)}
    for row in runs.values():
        assert not row["stopped"] and row["errors"] == 0 and row["audio_s"] > 0
        assert math.isfinite(row["rtf_p50"]) and row["rtf_p50"] > 0 and row["ttfp_p50_s"] > 0
        assert row["replays"] == 0  # a CPU has no graph runtime: the "on" runs are eager too
    assert stage["graphs_available"] is False and stage["stage_graphs"]["backend"] == "eager"
    runners = sections["graphs"]["result"]["runners"]
    assert any(r["name"] == "campplus" and r["disabled_reason"] == "CPU runs eagerly" for r in runners)
    goals = json.loads((out / dc.JSON_NAME).read_text())["goals"]
    assert goals["campplus_graph_p50_ms_T200"]["passed"] is None  # an H200 goal: not judged on a CPU
    assert goals["token2wav_stream_rtf_c1"]["passed"] is None
    assert goals["token2wav_throughput_c2_over_c1"]["passed"] is None


def test_smoke_with_fake_graphs_replays_campplus_from_graphs(tmp_path: Path) -> None:
    api, module = fake_graph_api()
    config = dc.CheckConfig(
        device="cpu",
        smoke=True,
        out_dir=tmp_path,
        sections=("assets", "campplus_parity", "campplus_latency", "graphs"),
    )
    report = dc.run_device_check(config, graph_api=api, log=lambda _: None)
    sections = report.document["sections"]
    assert {e["status"] for e in sections.values()} == {"ok"}
    parity = sections["campplus_parity"]["result"]["rows"]
    for frames in (97, 200):
        eager, graph = (
            next(r for r in parity if r["frames"] == frames and r["backend"] == b)
            for b in ("torch-eager", "torch-graph")
        )
        assert graph["max_abs"] == pytest.approx(eager["max_abs"], abs=1e-6)
    counters = sections["campplus_latency"]["result"]["graph_counters"]
    assert counters["backend"] == "fake-graph" and counters["captures"] == 2 and counters["failures"] == 0
    latency_calls = sum(r["n"] for r in sections["campplus_latency"]["result"]["rows"] if "graph" in r["backend"])
    assert counters["replays"] >= latency_calls and module.replays == counters["replays"]
    listed = [r for r in sections["graphs"]["result"]["runners"] if r["backend"] == "fake-graph"]
    assert listed and listed[-1]["captures"] == 2


def test_smoke_with_fake_graphs_replays_the_stage_from_graphs(tmp_path: Path) -> None:
    api, module = fake_graph_api()
    config = dc.CheckConfig(
        device="cpu", smoke=True, out_dir=tmp_path, sections=("stage_assets", "token2wav", "graphs")
    )
    report = dc.run_device_check(config, graph_api=api, log=lambda _: None)
    sections = report.document["sections"]
    assert {e["status"] for e in sections.values()} == {"ok"}, {k: e["error"] for k, e in sections.items()}
    stage = sections["token2wav"]["result"]
    assert stage["graphs_available"] is True and stage["graph_backend"] == "fake-graph"
    rows = stage["rows"]
    on = [r for r in rows if r["graphs"] and r["kind"] == "stream"]
    off = [r for r in rows if not r["graphs"]]
    assert all(r["replays"] > 0 and r["eager_fallbacks"] >= 0 for r in on)  # streaming chunks replay graphs
    assert all(r["replays"] == r["captures"] == r["capture_ms"] == 0 for r in off)  # off: no replay, no capture
    assert all((r["capture_ms"] > 0) == (r["captures"] > 0) for r in rows)  # capture time inside a row is shown
    totals = stage["stage_graphs"]
    assert totals["failures"] == 0 and totals["captures"] == module.captures.__len__() > 0
    assert totals["estimator_keys"] and totals["graphs"] > 0
    listed = {r["name"] for r in sections["graphs"]["result"]["runners"] if r["backend"] == "fake-graph"}
    assert {"flow-estimator.seg00", "hift"} <= listed


def test_smoke_with_fake_graphs_replays_cosyvoice3_exactly(tmp_path: Path) -> None:
    """The CosyVoice3 section's graph arms replay (flow pieces and the causal HiFT decoder) and stay exact."""
    api, _ = fake_graph_api()
    config = dc.CheckConfig(device="cpu", smoke=True, out_dir=tmp_path, sections=("cosyvoice3_assets", "cosyvoice3"))
    report = dc.run_device_check(config, graph_api=api, log=lambda _: None)
    sections = report.document["sections"]
    assert {e["status"] for e in sections.values()} == {"ok"}, {k: e["error"] for k, e in sections.items()}
    cv3 = sections["cosyvoice3"]["result"]
    assert cv3["graphs_available"] == {"float32": True, "reduced": True}
    graphs = {row["arm"]: row for row in cv3["accuracy"]["rows"]}["float32 graphs"]
    assert graphs["graph_counters"]["replays"] > 0 and graphs["graph_counters"]["graph_runtime"] == "fake-graph"
    assert graphs["whole"]["max_abs"] == 0.0 and graphs["worst_chunk_max_abs"] == 0.0  # replay == eager, bit for bit
    rows = cv3["rows"]
    assert all(r["replays"] > 0 for r in rows if r["graphs"])
    assert all(r["replays"] == 0 for r in rows if not r["graphs"])
    assert all(not r["stopped"] and r["audio_s"] > 0 for r in rows)


# ---------------------------------------------------------------------------------------------
# The runner's rules, on small sections
# ---------------------------------------------------------------------------------------------


def _run(tmp_path: Path, sections: list[dc.Section], deadline_s: float = 30.0) -> dc.DeviceCheckReport:
    config = dc.CheckConfig(device="cpu", out_dir=tmp_path, deadline_s=deadline_s)
    return dc.run_device_check(config, sections=sections, log=lambda _: None)


def test_a_failing_section_is_recorded_and_the_next_one_still_runs(tmp_path: Path) -> None:
    def broken(ctx: dc.SectionContext) -> None:
        ctx.result["before"] = 1
        raise RuntimeError("kernel exploded")

    def fine(ctx: dc.SectionContext) -> None:
        ctx.result["value"] = 42

    report = _run(tmp_path, [dc.Section("broken", "b", 5, 5, broken), dc.Section("fine", "f", 5, 5, fine)])
    on_disk = json.loads((tmp_path / dc.JSON_NAME).read_text())
    broken_entry = on_disk["sections"]["broken"]
    assert broken_entry["status"] == "error" and broken_entry["error"] == "RuntimeError: kernel exploded"
    assert broken_entry["result"] == {"before": 1} and any(
        "kernel exploded" in line for line in broken_entry["traceback"]
    )
    assert on_disk["sections"]["fine"] == report.document["sections"]["fine"]
    assert on_disk["sections"]["fine"]["status"] == "ok" and on_disk["sections"]["fine"]["result"] == {"value": 42}
    assert on_disk["complete"] is True


def test_results_are_on_disk_while_a_section_is_still_running(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []

    def measuring(ctx: dc.SectionContext) -> None:
        for i in range(3):
            ctx.result.setdefault("rows", []).append({"i": i, "value": float("nan") if i == 1 else i})
            ctx.flush()
            seen.append(json.loads((tmp_path / dc.JSON_NAME).read_text())["sections"]["measuring"])

    def odd_value(ctx: dc.SectionContext) -> None:
        ctx.result["device"] = torch.device("cpu")  # not JSON: written as its repr, the report stays writable

    _run(tmp_path, [dc.Section("measuring", "m", 5, 5, measuring), dc.Section("odd", "o", 5, 5, odd_value)])
    assert (
        json.loads((tmp_path / dc.JSON_NAME).read_text())["sections"]["odd"]["result"]["device"] == "device(type='cpu')"
    )
    assert [len(s["result"]["rows"]) for s in seen] == [1, 2, 3]
    assert all(s["status"] == "running" for s in seen)
    assert seen[-1]["result"]["rows"][1]["value"] is None  # non-finite numbers are written as null
    assert not list(tmp_path.glob("*.tmp*"))  # atomic writes leave no temporary files behind


def test_cooperative_stop_marks_partial_and_the_deadline_skips_later_sections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dc, "RESERVE_S", 0.0)
    monkeypatch.setattr(dc, "MIN_SECTION_S", 0.5)

    def looping(ctx: dc.SectionContext) -> None:
        count = 0
        while not ctx.out_of_time():
            count += 1
            time.sleep(0.01)
        ctx.result["count"] = count

    def never(ctx: dc.SectionContext) -> None:
        raise AssertionError("must be skipped")

    report = _run(tmp_path, [dc.Section("looping", "l", 60, 60, looping), dc.Section("late", "n", 5, 5, never)], 1.0)
    sections = report.document["sections"]
    assert sections["looping"]["status"] == "partial" and sections["looping"]["result"]["count"] > 0
    assert sections["looping"]["budget_s"] == pytest.approx(1.0, abs=0.1)
    assert sections["late"]["status"] == "skipped" and "global deadline" in sections["late"]["error"]


def test_hard_timer_stops_a_section_that_ignores_its_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dc, "GRACE_S", 0.2)
    monkeypatch.setattr(dc, "MIN_SECTION_S", 0.1)

    def stubborn(ctx: dc.SectionContext) -> None:
        ctx.result["steps"] = 0
        while True:  # never looks at its budget
            ctx.result["steps"] += 1
            time.sleep(0.01)

    def after(ctx: dc.SectionContext) -> None:
        ctx.result["ran"] = True

    start = time.monotonic()
    sections = [dc.Section("stubborn", "s", 0.3, 0.3, stubborn), dc.Section("after", "a", 5, 5, after)]
    report = _run(tmp_path, sections)
    assert time.monotonic() - start < 5
    entry = report.document["sections"]["stubborn"]
    assert entry["status"] == "timeout" and entry["result"]["steps"] > 0
    assert report.document["sections"]["after"]["result"] == {"ran": True}


def test_skip_is_a_reason_not_an_error(tmp_path: Path) -> None:
    def unavailable(ctx: dc.SectionContext) -> None:
        raise dc.SectionSkip("tensorrt is not installed")

    entry = _run(tmp_path, [dc.Section("trt", "t", 5, 5, unavailable)]).document["sections"]["trt"]
    assert entry["status"] == "skipped" and entry["error"] == "tensorrt is not installed"


def test_watchdog_writes_the_report_and_exits_when_the_main_thread_hangs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    codes: list[int] = []
    exited = threading.Event()

    def fake_exit(code: int) -> None:
        codes.append(code)
        exited.set()

    monkeypatch.setattr(dc.os, "_exit", fake_exit)
    report = dc.DeviceCheckReport(tmp_path / dc.JSON_NAME, {"sections": {}, "aborted": None})
    watchdog = dc._Watchdog(report, time.monotonic() + 0.05, lambda: "token2wav")
    watchdog.start()
    assert exited.wait(5)
    assert codes == [3]
    on_disk = json.loads(report.path.read_text())
    assert "section 'token2wav' did not return" in on_disk["aborted"]


def test_table_renders_partial_results_without_failing(tmp_path: Path) -> None:
    document = dc._new_document(dc.CheckConfig(device="cpu"), "cmd", dc.default_sections())
    document["sections"]["token2wav"]["result"] = {"concurrency": 1}
    document["sections"]["campplus_latency"]["result"] = {"rows": [{"frames": 200}]}  # cut mid-row
    document["sections"]["campplus_latency"]["status"] = "timeout"
    text = dc.render_text(document)
    assert "== token2wav: pending" in text and "no measurement" in text
    assert "cannot render the partial result: KeyError" in text and "INCOMPLETE" in text


def test_unknown_sections_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="unknown section.*bogus; known: machine, assets"):
        dc.select_sections(["bogus"], dc.default_sections())
    assert cli_main(["bench", "device-check", "--sections", "machine,bogus"]) == 2
    assert "--sections: unknown section(s) bogus" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "cuda"], "--device cuda"),
        (["--deadline-s", "0"], "--deadline-s must be a positive"),
        (["--threads", "0"], "--threads must be >= 1"),
        (["--onnx", "/no/such/campplus.onnx"], "--onnx /no/such/campplus.onnx: no such file"),
    ],
)
def test_cli_usage_errors_exit_2_with_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("VLLM_OMNI_TOKEN2WAV_PLATFORM", "cpu")
    from vllm_omni_token2wav import platforms

    platforms.reset_current_platform(None)
    try:
        assert cli_main(["bench", "device-check", "--out-dir", str(tmp_path), *args]) == 2
    finally:
        platforms.reset_current_platform(None)
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_out_dir_defaults_to_the_device_tools_out_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OUT", str(tmp_path))
    assert default_out_dir() == tmp_path
    monkeypatch.delenv("OUT")
    assert default_out_dir() == Path("out")
    import argparse

    parser = argparse.ArgumentParser()
    SUBCOMMAND.add_cli_args(parser)
    config = SUBCOMMAND.build_config(parser.parse_args(["--smoke", "--sections", "machine, graphs"]))
    assert config.sections == ("machine", "graphs") and config.resolved_deadline_s == dc.SMOKE_DEADLINE_S


def test_resampler_stand_in_is_band_limited_and_removed_afterwards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "soxr", None)  # `import soxr` raises ImportError: not installed
    with resampler() as which:
        assert which.startswith("scipy.signal.resample_poly")
        import soxr  # the stand-in

        t = np.arange(16000) / 16000.0
        tone = np.sin(2 * np.pi * 1000.0 * t)  # in band at both rates
        out = soxr.resample(tone, 16000, 24000)
        assert out.shape == (24000,)
        expected = np.sin(2 * np.pi * 1000.0 * np.arange(24000) / 24000.0)
        assert np.max(np.abs(out[200:-200] - expected[200:-200])) < 1e-2
        alias = soxr.resample(np.sin(2 * np.pi * 7000.0 * np.arange(24000) / 24000.0), 24000, 8000)  # above 4 kHz
        assert np.sqrt(np.mean(alias[100:-100] ** 2)) < 0.01  # removed, not folded back into the band
    assert sys.modules["soxr"] is None  # the blocked entry is back, not the stand-in


def test_agreement_and_percentile_against_hand_computed_values() -> None:
    got, ref = np.array([1.0, 2.0, 2.0]), np.array([1.0, 2.0, 3.0])
    a = agreement(got, ref)
    assert a["max_abs"] == 1.0
    assert a["rel_l2"] == pytest.approx(1.0 / math.sqrt(14.0))
    assert a["cosine"] == pytest.approx(11.0 / (3.0 * math.sqrt(14.0)))
    assert a["ref_rms"] == pytest.approx(math.sqrt(14.0 / 3.0))
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0 and percentile(values, 0.99) == 99.0 and percentile([7.0], 0.99) == 7.0
