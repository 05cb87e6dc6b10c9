# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav bench spk-embedding`: end to end on a reduced stand-in, user errors, Ctrl-C.

The end-to-end run uses the reduced-width stand-in `campplus.onnx` (same graph structure, narrow
layers) with two short lengths and a few iterations, so it checks the report's shape and honesty
(fields, PNG, stand-in labelling, sha256) rather than any latency number.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.bench_cli import run_bench, run_bench_subprocess
from vllm_omni_token2wav.entrypoints.cli.main import main

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

LENGTHS = (50, 120)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="session")
def reduced_onnx() -> Path:
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )

    return Path(ensure_standin_campplus_onnx(seed=0, reduced=True))


@pytest.fixture(scope="module")
def e2e(reduced_onnx: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One real CLI run (subprocess, as a user types it) on the reduced stand-in."""
    out = tmp_path_factory.mktemp("spk_bench")
    proc = run_bench_subprocess(
        out,
        "spk-embedding",
        "--onnx",
        str(reduced_onnx),
        "--lengths",
        ",".join(map(str, LENGTHS)),
        "--warmup",
        "1",
        "--iters",
        "4",
        "--threads",
        "1,2",
        timeout=180,
    )
    return {"proc": proc, "json": out / "report.json", "png": out / "report.png", "onnx": reduced_onnx}


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    return run_bench(capsys, "spk-embedding", *args)


def test_end_to_end_run_succeeds_and_prints_the_table(e2e: dict[str, Any]) -> None:
    proc = e2e["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    for backend in ("onnxruntime-cpu", "torch-cpu"):
        assert backend in proc.stdout
    assert "ratio vs ORT, 1 thread " in proc.stdout and "ratio vs ORT, 2 threads " in proc.stdout
    assert "get_campplus_torch: cold build" in proc.stdout
    for t in LENGTHS:  # best of the thread budgets and one verdict per T
        assert f"best of threads, T={t}: " in proc.stdout and f"verdict T={t}: " in proc.stdout
    # The reduced stand-in lives in the stand-in cache: the report must say its weights are not real.
    assert "STAND-IN" in proc.stdout and "NOT a real speaker space" in proc.stdout


def test_json_report_has_every_field(e2e: dict[str, Any]) -> None:
    assert e2e["proc"].returncode == 0, e2e["proc"].stderr
    report = json.loads(e2e["json"].read_text())
    assert report["complete"] is True and report["interrupted"] is False
    assert report["schema"].startswith("vllm-omni/bench-spk-embedding/")

    weights = report["weights"]
    assert weights["sha256"] == hashlib.sha256(e2e["onnx"].read_bytes()).hexdigest()
    assert weights["kind"] == "stand-in" and weights["matches_known_shipped"] is False
    assert weights["known_shipped_sha256"] == "a6ac6a63997761ae2997373e2ee1c47040854b4b759ea41ec48e4e42df0f4d73"

    env = report["environment"]
    import onnxruntime
    import torch

    assert env["torch_version"] == torch.__version__ and env["onnxruntime_version"] == onnxruntime.__version__
    assert env["threads"] == [1, 2] and env["torch_num_threads"] >= 1
    assert env["ort_seg_pool_mode"] in ("legacy", "exact") and env["device"] == "cpu"
    assert len(env["load_average_start"]) == 3 and len(env["load_average_end"]) == 3

    build = report["build"]
    assert build["torch_cold_build_ms"] > 0 and build["torch_cache_hit_us"] > 0
    # A cache hit is a dict lookup; a cold build parses and maps the whole graph.
    assert build["torch_cache_hit_us"] * 1e-3 < build["torch_cold_build_ms"]

    cells = {(c["backend"], c["frames"], c["threads"]): c for c in report["results"]}
    assert set(cells) == {(b, t, n) for b in ("ort", "torch") for t in LENGTHS for n in (1, 2)}
    for (backend, frames, threads), cell in cells.items():
        for clock in ("wall", "host", "host_cpu"):
            stats = cell[clock]
            assert stats["n"] == 4
            assert 0 < stats["min_ms"] <= stats["median_ms"] <= stats["p90_ms"] <= stats["p99_ms"] <= stats["max_ms"]
        ort_median = cells[("ort", frames, threads)]["wall"]["median_ms"]  # the same thread budget
        assert cell["ratio_vs_ort"] == pytest.approx(cell["wall"]["median_ms"] / ort_median)
        assert report["ratio_vs_ort"][backend][str(threads)][str(frames)] == cell["ratio_vs_ort"]
        if backend == "torch":
            # Parity on the serving transform: the torch port must agree with onnxruntime on CPU.
            assert cell["cosine_vs_ort"] >= 0.999999 and cell["rel_l2_diff_vs_ort"] <= 2e-3
            assert 0 <= cell["max_abs_diff_vs_ort"] <= cell["rel_l2_diff_vs_ort"] * cell["ort_max_abs"] * 192**0.5
            assert cell["parity_ok"] is True
            # the threads each timed call ran with: at most its budget (fewer when other threads held cores)
            used = cell["threads_used"]
            assert sum(used.values()) == 4 and all(1 <= int(k) <= threads for k in used)
        else:
            assert cell["ratio_vs_ort"] == 1.0 and cell["cosine_vs_ort"] is None

    verdicts = {v["frames"]: v for v in report["speed_verdicts"]}
    assert sorted(verdicts) == list(LENGTHS)
    for frames, verdict in verdicts.items():
        best = {b["backend"]: b for b in verdict["best"]}
        for backend in ("ort", "torch"):
            fastest = min(
                n
                for n in (1, 2)
                if cells[(backend, frames, n)]["wall"]["median_ms"]
                == min(cells[(backend, frames, m)]["wall"]["median_ms"] for m in (1, 2))
            )
            assert best[backend]["threads"] == fastest
        assert verdict["faster"] == min(best, key=lambda b: best[b]["median_ms"])

    prompt = report["prompt_cache"]
    if prompt["unavailable"] is None:
        assert prompt["hit"]["median_ms"] < prompt["miss_ms"]


def test_png_plot_opens(e2e: dict[str, Any]) -> None:
    assert e2e["proc"].returncode == 0, e2e["proc"].stderr
    data = e2e["png"].read_bytes()
    assert data[:8] == PNG_SIGNATURE
    from PIL import Image

    with Image.open(e2e["png"]) as image:
        image.load()
        assert image.size[0] >= 600 and image.size[1] >= 300


def test_trt_backend_without_tensorrt_is_a_clear_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = _cli(capsys, "--backends", "ort,trt", "--json", str(tmp_path / "r.json"))
    assert code == 2
    assert "TensorRT" in err and "Traceback" not in err
    assert not (tmp_path / "r.json").exists()


def test_garbage_onnx_gives_the_loader_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "campplus.onnx"
    bad.write_bytes(b"this is not an onnx file" * 10)
    code, _, err = _cli(capsys, "--onnx", str(bad), "--fast", "--json", str(tmp_path / "r.json"))
    assert code == 2
    assert str(bad) in err and "Traceback" not in err


def test_onnx_of_another_network_gives_the_loader_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import torch

    other = tmp_path / "other.onnx"
    net = torch.nn.Sequential(torch.nn.Conv1d(80, 16, 3), torch.nn.ReLU()).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the legacy exporter announces its retirement
        torch.onnx.export(net, (torch.zeros(1, 80, 20),), str(other), dynamo=False, input_names=["input"])
    code, _, err = _cli(capsys, "--onnx", str(other), "--fast", "--json", str(tmp_path / "r.json"))
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.torch_backend import load_campplus_from_onnx

    with pytest.raises(Exception) as loader_error:
        load_campplus_from_onnx(other)
    assert code == 2 and "Traceback" not in err
    # The CLI shows the loader's own diagnosis (not a generic failure).
    assert str(loader_error.value).splitlines()[0][:60] in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--lengths", "2"], "--lengths"),
        (["--lengths", "97,abc"], "--lengths"),
        (["--lengths", ","], "--lengths"),
        (["--backends", "ort,onnx"], "--backends"),
        (["--backends", "torch,torch"], "--backends"),
        (["--iters", "0"], "--iters"),
        (["--warmup", "-1"], "--warmup"),
        (["--batch", "0"], "--batch"),
        (["--threads", "0"], "--threads"),
        (["--device", "tpu"], "--device"),
        (["--device", "cuda:x"], "--device"),
        (["--onnx", "/nonexistent/campplus.onnx"], "--onnx"),
        (["--audio", "/nonexistent/prompt.wav"], "--audio"),
    ],
)
def test_invalid_options_are_usage_errors(
    capsys: pytest.CaptureFixture[str], args: list[str], needle: str, tmp_path: Path
) -> None:
    code, out, err = _cli(capsys, *args, "--json", str(tmp_path / "r.json"))
    assert code == 2
    assert err.startswith("vllm-omni-token2wav: error: ") and needle in err and "Traceback" not in err
    assert not (tmp_path / "r.json").exists()


def test_non_integer_option_is_rejected_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "spk-embedding", "--iters", "many"])
    assert exc.value.code == 2
    assert "invalid int value" in capsys.readouterr().err


def test_ctrl_c_prints_the_partial_report_and_exits_130(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, reduced_onnx: Path, tmp_path: Path
) -> None:
    from vllm_omni_token2wav.benchmarks.spk_embedding import run as spk_embedding

    real = spk_embedding._timed_call
    calls = {"n": 0}

    def interrupt_on_fifth(*a: Any, **k: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(spk_embedding, "_timed_call", interrupt_on_fifth)
    json_path = tmp_path / "partial.json"
    args = ["--onnx", str(reduced_onnx), "--lengths", "40,60", "--warmup", "0", "--iters", "5", "--threads", "1"]
    code, out, err = _cli(capsys, *args, "--json", str(json_path), "--plot", str(tmp_path / "p.png"))
    assert code == 130
    assert "PARTIAL REPORT" in out and "interrupted" in err
    report = json.loads(json_path.read_text())
    assert report["complete"] is False and report["interrupted"] is True
    # Two full iterations (ort + torch each) of the first length were measured before the interrupt.
    measured = {(c["backend"], c["frames"]): c["wall"]["n"] for c in report["results"]}
    assert measured == {("ort", 40): 2, ("torch", 40): 2}


def test_latency_stats_match_the_statistics_module() -> None:
    from vllm_omni_token2wav.benchmarks.spk_embedding.run import LatencyStats

    rng = np.random.default_rng(0)
    samples_ns = [int(v) for v in rng.integers(1_000_000, 50_000_000, size=101)]
    stats = LatencyStats.from_ns(samples_ns)
    ms = [v / 1e6 for v in samples_ns]
    deciles = statistics.quantiles(ms, n=10, method="inclusive")
    percentiles = statistics.quantiles(ms, n=100, method="inclusive")
    assert stats.median_ms == pytest.approx(statistics.median(ms))
    assert stats.p90_ms == pytest.approx(deciles[8])
    assert stats.p99_ms == pytest.approx(percentiles[98])
    assert stats.n == 101 and stats.max_ms == pytest.approx(max(ms))


def test_feature_length_follows_kaldi_framing() -> None:
    """T frames need 400 + (T-1)*160 samples (25 ms / 10 ms, snip_edges), checked with kaldi-native-fbank."""
    knf = pytest.importorskip("kaldi_native_fbank")
    from vllm_omni_token2wav.benchmarks.spk_embedding.run import samples_for_frames

    for frames in (4, 97, 200):
        n = samples_for_frames(frames)
        for extra in (0, 159):
            opts = knf.FbankOptions()
            opts.frame_opts.dither = 0.0
            opts.frame_opts.samp_freq = 16000
            opts.mel_opts.num_bins = 80
            fbank = knf.OnlineFbank(opts)
            fbank.accept_waveform(16000, np.zeros(n + extra, dtype=np.float32).tolist())
            fbank.input_finished()
            assert fbank.num_frames_ready == frames


def test_parity_metrics_match_numpy() -> None:
    import torch

    from vllm_omni_token2wav.benchmarks.spk_embedding.run import parity, tolerances_for

    rng = np.random.default_rng(1)
    ref = rng.standard_normal((2, 192)) * 1e3
    out = ref + rng.standard_normal((2, 192)) * 1e-1
    m = parity(torch.from_numpy(out).float(), torch.from_numpy(ref).float())
    cos_np = min(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(out, ref, strict=True))
    rel_np = max(float(np.linalg.norm(a - b) / np.linalg.norm(b)) for a, b in zip(out, ref, strict=True))
    assert m.cosine == pytest.approx(cos_np, abs=1e-6)
    assert m.rel_l2_diff == pytest.approx(rel_np, rel=1e-2)
    assert m.max_abs_diff == pytest.approx(float(np.abs(out - ref).max()), rel=1e-2)
    assert m.ref_max_abs == pytest.approx(float(np.abs(ref).max()), rel=1e-6)
    assert m.ok(tolerances_for(torch.device("cpu")))
    # A wrong scale keeps the cosine at 1 but is a mismatch.
    doubled = parity(torch.from_numpy(2 * ref).float(), torch.from_numpy(ref).float())
    assert doubled.cosine == pytest.approx(1.0) and not doubled.ok(tolerances_for(torch.device("cpu")))


def test_real_file_is_recognised_by_sha256(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from vllm_omni_token2wav.benchmarks.spk_embedding import run as spk_embedding

    path = tmp_path / "campplus.onnx"
    path.write_bytes(b"pretend asset")
    digest = hashlib.sha256(b"pretend asset").hexdigest()
    other = spk_embedding.describe_weights(path, standin=False)
    assert (other.kind, other.label) == ("unknown", "unknown file")
    from vllm_omni_token2wav import known_files

    row = known_files.KnownFile("official CosyVoice campplus.onnx", "campplus.onnx", len(b"pretend asset"), digest, "t")
    monkeypatch.setattr(known_files, "KNOWN_FILES", (row,))
    info = spk_embedding.describe_weights(path, standin=False)
    assert info.kind == "official" and info.matches_known_shipped and info.sha256 == digest
    assert info.label == "official CosyVoice campplus.onnx"


def test_bench_help_lists_spk_embedding() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_omni_token2wav", "bench", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "spk-embedding" in proc.stdout


def test_default_weights_are_the_generated_standin_and_say_so(
    monkeypatch: pytest.MonkeyPatch, reduced_onnx: Path, tmp_path: Path
) -> None:
    """Without --onnx the run generates (first use) or reuses the cached stand-in and labels it."""
    from vllm_omni_token2wav.benchmarks.spk_embedding import run as spk_embedding
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus import standin

    stages: list[str] = []

    class Recorder:
        def stage(self, text: str) -> None:
            stages.append(text)

        def start(self, total: int) -> None: ...

        def advance(self, calls: int, text: str) -> None: ...

    missing = tmp_path / "campplus-full.onnx"
    requested: list[dict[str, Any]] = []
    monkeypatch.setattr(standin, "standin_path", lambda **kw: missing)

    def fake_ensure(**kw: Any) -> Path:
        requested.append(kw)
        return reduced_onnx

    monkeypatch.setattr(standin, "ensure_standin_campplus_onnx", fake_ensure)
    info = spk_embedding.resolve_weights(None, Recorder())
    assert requested == [{"seed": 0, "reduced": False}]
    assert info.kind == "stand-in" and info.standin_generated_s is not None
    assert "not a real speaker space" in info.note
    assert any("first use" in s for s in stages)


def _serves_on_cpu() -> bool:
    from vllm_omni_token2wav.platforms import get_current_platform

    return get_current_platform().device_type == "cpu"


@pytest.mark.skipif(not _serves_on_cpu(), reason="checks the message a CPU-only host gives for --device cuda")
def test_accelerator_device_on_a_cpu_host_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, "--device", "cuda:0", "--fast")
    assert code == 2 and "--device" in err and "serves on cpu" in err and "Traceback" not in err


def test_prompt_cache_row_times_a_miss_then_hits_on_the_full_size_standin() -> None:
    """The prompt-cache row needs a 192-d export (the facade checks the width): the full-size stand-in."""
    import torch

    from vllm_omni_token2wav.benchmarks.spk_embedding.run import BenchConfig, SpkEmbeddingBenchmark, load_clip
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )

    full = Path(ensure_standin_campplus_onnx(seed=0, reduced=False))
    clip, _ = load_clip(None)
    bench = SpkEmbeddingBenchmark(BenchConfig(onnx=full, prompt_cache_iters=20))
    bench._measure_prompt_cache(full, clip, torch.device("cpu"))
    times = bench.report.prompt_cache
    assert times is not None and times.unavailable is None, times
    assert times.hit is not None and times.hit.n == 20
    assert times.prompt_seconds == pytest.approx(clip.size / 16000)
    # A hit hashes the waveform; the miss also ran the fbank, CAM++ and the 24 kHz mel.
    assert times.hit.median_ms < times.miss_ms
    assert times.backend is not None and times.backend != "None"


def _cell(backend: str, threads: int, frames: int, median_ms: float) -> Any:
    """A CellResult with every latency statistic at `median_ms` (report logic tests)."""
    from vllm_omni_token2wav.benchmarks.spk_embedding.run import CellResult, LatencyStats

    stats = LatencyStats(10, median_ms, median_ms, median_ms, median_ms, median_ms, median_ms)
    name = "onnxruntime-cpu" if backend == "ort" else "torch-cpu"
    return CellResult(backend, name, frames, 1, threads, stats, stats, stats)


def test_best_of_takes_each_backends_fastest_budget_and_the_verdict_the_fastest_backend() -> None:
    from vllm_omni_token2wav.benchmarks.spk_embedding.report import best_of_lines, speed_verdict_lines
    from vllm_omni_token2wav.benchmarks.spk_embedding.run import BenchReport, best_of

    cell = _cell
    report = BenchReport(config={})
    report.results = [
        cell("ort", 1, 97, 20.0),
        cell("torch", 1, 97, 18.0),
        cell("ort", 2, 97, 14.0),
        cell("torch", 2, 97, 16.0),  # torch's best (1 thread, 18 ms) loses to onnxruntime's (2 threads, 14 ms)
        cell("ort", 1, 200, 35.0),
        cell("torch", 1, 200, 30.0),
        cell("ort", 2, 200, 25.0),
        cell("torch", 2, 200, 20.0),
    ]
    rows = {b.backend: b for b in best_of(report, 97)}
    assert (rows["ort"].threads, rows["torch"].threads) == (2, 2)
    assert rows["torch"].ratio_vs_best_ort == pytest.approx(16.0 / 14.0)
    assert [b.backend for b in best_of(report, 200)] == ["torch", "ort"]
    lines = speed_verdict_lines(report)
    assert lines[0].startswith("verdict T=97: onnxruntime-cpu is faster (14.00 ms @2t vs torch-cpu 16.00 ms @2t")
    assert lines[1].startswith("verdict T=200: torch-cpu is faster (20.00 ms @2t vs onnxruntime-cpu 25.00 ms @2t")
    assert "torch-cpu 20.00 ms @2t = 0.80 x ORT" in best_of_lines(report)[1]
    verdicts = report.to_dict()["speed_verdicts"]
    assert [(v["frames"], v["faster"]) for v in verdicts] == [(97, "ort"), (200, "torch")]


# ---- what a user reads: output folder, progress in logs, the verdict, a busy host ---------------


@pytest.fixture(scope="module")
def small_report(reduced_onnx: Path) -> Any:
    """A complete library run on the reduced stand-in: one length, two timed calls."""
    from vllm_omni_token2wav.benchmarks.spk_embedding.run import BenchConfig, SpkEmbeddingBenchmark

    config = BenchConfig(onnx=reduced_onnx, lengths=(40,), warmup=0, iters=2, threads=(1,), prompt_cache_iters=1)
    return SpkEmbeddingBenchmark(config).run()


def test_the_report_ends_with_a_verdict_on_parity_and_the_policy_choice(small_report: Any) -> None:
    from vllm_omni_token2wav.benchmarks.spk_embedding.report import render_text, verdict_line
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.selection import CPU_DEVICE_PATH_BACKEND

    torch_cell = small_report.cell("torch", 40)
    assert torch_cell.parity_ok is True
    line = verdict_line(small_report)
    assert render_text(small_report).rstrip("\n").splitlines()[-1] == line
    assert line.startswith("verdict: parity ok at every T (40); policy on cpu picks ")
    picked = {"onnxruntime": "onnxruntime-cpu", "torch": "torch-cpu"}[CPU_DEVICE_PATH_BACKEND]
    assert f"picks {picked} (CPU_DEVICE_PATH_BACKEND = '{CPU_DEVICE_PATH_BACKEND}')" in line
    # The reason is the measured ratio of this run.
    ratio = f"{torch_cell.ratio_vs_ort:.2f}x onnxruntime's latency"
    assert ratio in line


def test_the_verdict_names_parity_failures(small_report: Any) -> None:
    import dataclasses

    from vllm_omni_token2wav.benchmarks.spk_embedding.report import verdict_line

    failed = dataclasses.replace(small_report.cell("torch", 40), parity_ok=False)
    report = dataclasses.replace(small_report, results=[small_report.cell("ort", 40), failed])
    assert verdict_line(report).startswith("verdict: parity FAIL at torch-cpu T=40;")


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        ((1.2, 1, 1), (1.3, 1, 1), None),
        ((1.6, 1, 1), (0.2, 1, 1), "1.60 at start"),
        ((0.1, 0, 0), (3.0, 2, 1), "3.00 at end"),
    ],
)
def test_a_busy_host_is_flagged_in_the_header(
    small_report: Any, start: tuple, end: tuple, expected: str | None
) -> None:
    import dataclasses

    from vllm_omni_token2wav.benchmarks.spk_embedding.report import header_lines, load_warning

    env = dataclasses.replace(small_report.environment, usable_cores=2, load_average_start=start, load_average_end=end)
    report = dataclasses.replace(small_report, environment=env)
    warning = load_warning(report)
    if expected is None:
        assert warning is None
    else:
        assert warning is not None and expected in warning and "2 usable cores" in warning
        assert "timings are unreliable" in warning and warning in header_lines(report)


def test_default_reports_go_to_out_progress_is_plain_lines_and_the_verdict_is_last(
    capsys: pytest.CaptureFixture[str], reduced_onnx: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["--onnx", str(reduced_onnx), "--lengths", "40", "--warmup", "0", "--iters", "2", "--threads", "1"]
    code, out, err = _cli(capsys, *args)
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "spk_embedding_report.json",
        "spk_embedding_report.png",
    ]
    assert "wrote out/spk_embedding_report.json and out/spk_embedding_report.png" in out
    # stderr is not a terminal here: the timing loop reports in whole lines, no carriage returns.
    assert "\r" not in err and "[spk-embedding] timing: 4/4 call" in err
    table = out.split("wrote ")[0].rstrip("\n").splitlines()
    assert table[-1].startswith("verdict: parity ok at every T (40)")


def test_an_onnx_that_is_not_cam_plus_plus_is_refused_before_any_work(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_omni_token2wav.benchmarks.spk_embedding import run as spk_embedding

    def must_not_run(*args: Any) -> Any:
        raise AssertionError("features were prepared for a file that is not a CAM++ export")

    monkeypatch.setattr(spk_embedding, "load_clip", must_not_run)
    bad = tmp_path / "campplus.onnx"
    bad.write_bytes(b"<html>not a model</html>")
    code, _, err = _cli(capsys, "--onnx", str(bad), "--fast", "--json", str(tmp_path / "r.json"))
    assert code == 2 and "Traceback" not in err
    assert err.count(str(bad)) == 1 and "not a readable ONNX file" in err
    assert not (tmp_path / "r.json").exists()


def test_the_prompt_cache_step_uses_the_reported_onnxruntime_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompt-cache step's onnxruntime session gets the largest measured thread budget."""
    import torch

    from tests.helpers.token2wav import SessionCounter
    from vllm_omni_token2wav.benchmarks.spk_embedding.run import BenchConfig, SpkEmbeddingBenchmark, load_clip
    from vllm_omni_token2wav.model_executor.models.speaker_embedding import selection as speaker_embedding
    from vllm_omni_token2wav.model_executor.models.speaker_embedding.campplus.standin import (
        ensure_standin_campplus_onnx,
    )

    monkeypatch.setattr(speaker_embedding, "CPU_DEVICE_PATH_BACKEND", "onnxruntime")
    counter = SessionCounter(monkeypatch)
    full = Path(ensure_standin_campplus_onnx(seed=0, reduced=False))
    clip, _ = load_clip(None)
    bench = SpkEmbeddingBenchmark(BenchConfig(onnx=full, threads=(3,), prompt_cache_iters=2))
    bench._measure_prompt_cache(full, clip, torch.device("cpu"))
    assert bench.report.prompt_cache is not None and bench.report.prompt_cache.unavailable is None
    assert [c["sess_options"].intra_op_num_threads for c in counter.calls] == [3]


def test_the_verdict_names_the_thread_budget_of_each_cell_when_several_ran() -> None:
    from vllm_omni_token2wav.benchmarks.spk_embedding.report import verdict_line
    from vllm_omni_token2wav.benchmarks.spk_embedding.run import BenchReport, PolicyChoice

    report = BenchReport(config={}, complete=True)
    medians = {(97, 1): (20.0, 22.0), (97, 2): (14.0, 16.0), (200, 1): (35.0, 30.0), (200, 2): (25.0, 20.0)}
    for (frames, threads), (ort_ms, torch_ms) in medians.items():
        ort, torch_cell = _cell("ort", threads, frames, ort_ms), _cell("torch", threads, frames, torch_ms)
        ort.ratio_vs_ort, torch_cell.ratio_vs_ort = 1.0, torch_ms / ort_ms
        torch_cell.parity_ok = True
        report.results += [ort, torch_cell]
    report.policy = PolicyChoice("cpu", "onnxruntime-cpu", "ort", "CPU_DEVICE_PATH_BACKEND = 'onnxruntime'")
    line = verdict_line(report)
    assert line.startswith("verdict: parity ok at every T (97, 200); policy on cpu picks onnxruntime-cpu")
    assert line.endswith(
        "torch-cpu measured 0.80-1.14x onnxruntime's latency here, faster than onnxruntime at T=200@1t,200@2t"
    )
    report.policy = PolicyChoice("cpu", "torch-cpu", "torch", "CPU_DEVICE_PATH_BACKEND = 'torch'")
    assert verdict_line(report).endswith("slower than onnxruntime at T=97@1t,97@2t")
