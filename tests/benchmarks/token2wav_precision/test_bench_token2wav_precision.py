# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.token2wav_precision`: a reduced-precision flow stays within the recorded bound.

The recorded bound (benchmarks/results/token2wav_precision_cpu.json, the worst of its requests) is what
docs/benchmarks/token2wav_precision.md states; this reruns the recorded settings for one of its requests
through the benchmark's CLI, for every family and both reduced dtypes, and checks that the deviation
from the fp32 flow stays within it (a small margin for another CPU's kernels), that the reduced run did
run reduced (it deviates at all), and that bf16 (7 mantissa bits) deviates more than fp16 (10 bits).
The mel is the bound's quantity; the sample-wise audio difference is not checked (the stand-in vocoder
turns any mel change of that size into a phase shift, see the document), its STFT magnitude is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import run_home

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
MEL_MARGIN = 1.25
SPECTRUM_MARGIN = 1.5


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    return json.loads((RESULTS / "token2wav_precision_cpu.json").read_text())


@pytest.fixture(scope="module")
def measured(recorded: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("precision") / "precision.json"
    argv = ["--tokens", str(recorded["tokens"]), "--n-timesteps", str(recorded["n_timesteps"])]
    argv += ["--requests", "1", "--json", str(out)]
    # in-process, as `run_dev` runs it (a module-scoped fixture cannot take `capsys`)
    assert run_home("token2wav_precision", argv) == 0
    assert out.with_suffix(".txt").is_file()
    return json.loads(out.read_text())


def _rows(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(row["family"], row["flow_dtype"]): row for row in doc["flow"]}


def test_every_family_and_reduced_dtype_stays_within_the_recorded_bound(
    measured: dict[str, Any], recorded: dict[str, Any]
) -> None:
    bound = _rows(recorded)
    rows = _rows(measured)
    assert rows.keys() == bound.keys() and {f for f, _ in rows} == {"minicpmo_4_5", "step_audio2", "cosyvoice3"}
    for key, row in rows.items():
        for part in ("whole_mel", "chunk_mel"):
            for metric in ("max_abs", "rel_l2"):
                limit = bound[key][part][metric] * MEL_MARGIN
                assert 0 < row[part][metric] <= limit, (key, part, metric, row[part][metric], limit)
        for part in ("whole_spectrum", "stream_spectrum"):
            assert row[part]["rel_l2"] <= bound[key][part]["rel_l2"] * SPECTRUM_MARGIN, (key, part)


def test_bf16_deviates_more_than_fp16(measured: dict[str, Any]) -> None:
    rows = _rows(measured)
    for family in ("minicpmo_4_5", "step_audio2", "cosyvoice3"):
        assert rows[family, "bfloat16"]["whole_mel"]["rel_l2"] > rows[family, "float16"]["whole_mel"]["rel_l2"]


def test_the_report_has_the_recorded_layout(measured: dict[str, Any], recorded: dict[str, Any]) -> None:
    assert measured.keys() == recorded.keys()
    assert [r.keys() for r in measured["flow"]] == [r.keys() for r in recorded["flow"]]
    assert {(r["family"], r["autocast_dtype"]) for r in measured["vocoder_autocast"]} == {
        (r["family"], r["autocast_dtype"]) for r in recorded["vocoder_autocast"]
    }
