# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.token2wav_row_cost`: a `--smoke` run as typed, the line fit and bounds, option errors.

The run uses the reduced stand-in with the smoke sizes (1 and 2 rows, 2 Euler steps), so it checks
the report's shape and honesty (the parts add up to the forward, both modes at every row count,
the fit and its bounds, the profile categories, the table and the PNG) rather than any speed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.token2wav_row_cost.run import (
    PARTS,
    RowCostReport,
    category,
    fit_line,
    split_parts,
)
from tests.helpers.bench_cli import run_dev, run_dev_subprocess
from tests.helpers.recorder import recorder

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("t2w_row_cost")
    proc = run_dev_subprocess(out, "token2wav_row_cost", "--smoke", "--device", "cpu", timeout=600)
    return {"proc": proc, "json": out / "report.json", "png": out / "report.png"}


def test_smoke_run_prints_the_table_and_writes_json_and_plot(smoke: dict[str, Any]) -> None:
    proc = smoke["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for needle in ("R=1 batched", "R=2 batched", "CFM estimator", "per launch", "op categories", "convolution"):
        assert needle in proc.stdout, needle
    assert smoke["png"].read_bytes().startswith(PNG_SIGNATURE)


def test_smoke_json_parts_add_up_and_every_row_count_has_both_modes(smoke: dict[str, Any]) -> None:
    assert smoke["proc"].returncode == 0, smoke["proc"].stderr
    report = json.loads(smoke["json"].read_text())
    assert report["schema"] == "vllm-omni/bench-token2wav-row-cost/1" and report["complete"] is True
    assert report["environment"]["threads"] == 1 and report["config"]["rows"] == [1, 2]
    assert set(report["per_row_ms"]) == {"1", "2"}
    for modes in report["per_row_ms"].values():
        assert set(modes) == {"batched", "solo"}
        for parts in modes.values():
            total = sum(parts[p] for p in PARTS if p != "forward")
            assert total == pytest.approx(parts["forward"], rel=1e-9)  # the parts partition the forward
            for part in ("encoder", "estimator", "source", "decode"):
                assert parts[part] > 0, part
    model = report["model"]
    assert set(model["parts"]) == {"flow", "vocoder", "engine"}
    assert set(model["ratio_measured"]) == {"1", "2"} and set(model["ratio_bound"]) == {"1", "2", "8", "32"}
    assert set(report["profile_ms"]) == {"batched", "solo"}
    assert {"convolution", "gemm", "attention"} <= set(report["profile_ms"]["solo"])


def test_line_fit_recovers_per_launch_and_per_row_costs() -> None:
    rows = [1.0, 2.0, 4.0, 8.0]
    assert fit_line(rows, [30 + 5 * r for r in rows]) == pytest.approx((30.0, 5.0))
    assert fit_line([4.0], [20.0]) == (0.0, 5.0)  # one point: all of it per row
    with pytest.raises(ValueError, match="2 x values and 1 y values"):
        fit_line([1.0, 2.0], [1.0])


def test_bounds_follow_the_fit_and_a_noisy_fit_gives_none() -> None:
    def parts(forward: float, flow: float, vocoder: float) -> dict[str, float]:
        return split_parts(forward, {"flow": flow, "vocoder": vocoder, "encoder": 0.1 * flow})

    report = RowCostReport(config={})
    # Launch times t(R) = 20 + 10 R (flow), 10 + 5 R (vocoder), 1 + 1 R (engine) ms; a row alone: 47 ms.
    for r in (1, 2, 4):
        flow, voc, eng = (20 + 10 * r) / 1e3, (10 + 5 * r) / 1e3, (1 + r) / 1e3
        batched = {k: v * 1e3 / r for k, v in parts(flow + voc + eng, flow, voc).items()}
        solo = {k: v * 1e3 / r for k, v in parts(0.047 * r, 0.030 * r, 0.015 * r).items()}
        report.per_row_ms[r] = {"batched": batched, "solo": solo}
    model = report.model()
    assert model["parts"]["flow"]["per_launch_ms"] == pytest.approx(20.0)
    assert model["parts"]["vocoder"]["per_row_ms"] == pytest.approx(5.0)
    assert model["ideal_batched_row_ms"] == pytest.approx(16.0)
    assert model["ratio_bound_infinite_rows"] == pytest.approx(47.0 / 16.0)
    assert model["ratio_bound"][8] == pytest.approx(47.0 / (31.0 / 8 + 16.0))
    assert model["ratio_measured"][4] == pytest.approx(47.0 / ((31 + 16 * 4) / 4))
    report.per_row_ms[4]["batched"]["flow"] = 1.0  # a timing far below the line: negative per-row fit
    assert report.model()["ratio_bound_infinite_rows"] is None


def test_op_categories() -> None:
    assert category("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert category("aten::addmm") == "gemm" and category("aten::mkldnn_convolution") == "convolution"
    assert category("aten::normal_") == "rng" and category("aten::sin") == "sine"
    assert category("aten::index_select") == "copy / cat / gather" and category("aten::gelu") == "elementwise / norm"
    assert category("Optimizer.step") == "other"


def test_recorders_name_results_by_size_threads_clock_and_talker() -> None:
    stem_for = recorder("token2wav_row_cost").stem_for
    assert stem_for([]) == "token2wav_row_cost"
    assert stem_for(["--threads", "2"]) == "token2wav_row_cost_2threads"
    assert stem_for(["--full", "--threads", "1"]) == "token2wav_row_cost_full"
    assert stem_for(["--clock", "cpu"]) == "token2wav_row_cost_cpuclock"
    serve = recorder("token2wav_serve").stem_for
    assert serve(["--device", "cpu"]) == "token2wav_serve"  # the default record keeps its name
    assert serve(["--talker-rate", "100"]) == "token2wav_serve"
    assert serve(["--full", "--talker-rate", "10000", "--clock", "cpu"]) == "token2wav_serve_full_talker10000_cpuclock"
    assert serve(["--threads=2"]) == "token2wav_serve_2threads"
    assert serve(["--engine"]) == "token2wav_serve_engine"  # the served stack never overwrites the emulated record
    assert serve(["--engine", "--request-rate", "2"]) == "token2wav_serve_engine_poisson2"
    assert serve(["--engine", "--clock", "wall"]) == "token2wav_serve_engine_wallclock"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rows", "1,x"], "--rows '1,x': expected comma-separated ints"),
        (["--rows", "2,2"], "expected distinct row counts >= 1"),
        (["--reps", "0"], "--reps must be >= 1"),
        (["--reference-seconds", "0"], "--reference-seconds must be > 0"),
        (["--clock", "cpu", "--threads", "2"], "the cpu clock needs --device cpu and 1 thread"),
    ],
)
def test_option_errors_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], message: str
) -> None:
    code, _, err = run_dev(capsys, "token2wav_row_cost", *argv, "--json", str(tmp_path / "r.json"))
    assert code == 2 and message in err and "Traceback" not in err
