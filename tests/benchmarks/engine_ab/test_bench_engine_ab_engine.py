# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav bench engine-ab --smoke --families step_audio2` as typed: both arms in one real run.

Two `vllm-omni-token2wav serve` processes of Step-Audio2's code2wav stage alone start side by side (about
2 minutes on 2 cores), one with vLLM-Omni's own class (`VLLM_OMNI_TOKEN2WAV_OVERRIDES=0`), one with ours;
each gets two short requests at c = 1. In CI the README smoke (tools/readme_install_smoke.sh) has just run
this command from the README's install; the test checks that run's files instead of starting both arms again.
Whether upstream's class can load our stand-in folder is not what is checked (it could not when this test was
written: `s3tokenizer` rejects the stand-in speech tokenizer ONNX): each arm must end with either measurements
or a recorded failure (status, reason, first error line), ours must be measured, and the table, the JSON and
the verdict must say which.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.bench_cli import run_bench_subprocess
from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the engine A/B benchmark")

REQUESTS = 2
TOKENS = 20  # the smoke plan: 0.8 s per request


# Set by .ci/run: the folder where tools/readme_install_smoke.sh ran this very command from the README's
# install (`--json engine_ab_smoke.json --plot engine_ab_smoke.png`, its stdout, stderr and exit code kept).
SMOKE_DIR_ENV = "VLLM_OMNI_TOKEN2WAV_ENGINE_AB_SMOKE_DIR"


def _readme_smoke(folder: Path) -> dict[str, Any]:
    files = {name: folder / name for name in ("engine_ab_smoke.json", "stdout.txt", "stderr.txt", "returncode")}
    missing = [str(path) for path in files.values() if not path.is_file()]
    if missing:
        pytest.fail(f"{SMOKE_DIR_ENV}={folder}: the README smoke left no {', '.join(missing)}")
    proc = subprocess.CompletedProcess(
        args=["vllm-omni-token2wav", "bench", "engine-ab", "--smoke", "--families", "step_audio2"],
        returncode=int(files["returncode"].read_text()),
        stdout=files["stdout.txt"].read_text(),
        stderr=files["stderr.txt"].read_text(),
    )
    report = json.loads(files["engine_ab_smoke.json"].read_text())
    return {"proc": proc, "report": report, "png": folder / "engine_ab_smoke.png"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if os.environ.get(SMOKE_DIR_ENV):
        return _readme_smoke(Path(os.environ[SMOKE_DIR_ENV]))
    out = tmp_path_factory.mktemp("engine_ab")
    proc = run_bench_subprocess(out, "engine-ab", "--smoke", "--families", "step_audio2", timeout=900)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else None
    return {"proc": proc, "report": report, "png": out / "report.png"}


def test_both_arms_end_with_measurements_or_a_recorded_failure(smoke: dict[str, Any]) -> None:
    proc, report = smoke["proc"], smoke["report"]
    assert report is not None, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert report["schema"] == "vllm-omni/bench-engine-ab/1" and report["complete"] is True
    family = report["families"]["step_audio2"]
    assert family["complete"] is True and set(family["arms"]) == {"upstream", "ours"}
    ours, upstream = family["arms"]["ours"], family["arms"]["upstream"]
    assert upstream["overrides_env"] == "VLLM_OMNI_TOKEN2WAV_OVERRIDES=0"
    assert (
        upstream["max_num_seqs"] == 1
        and upstream["max_num_seqs_source"] == "vllm_omni/deploy/step_audio_2.yaml stage 1"
    )
    assert ours["overrides_env"] == "VLLM_OMNI_TOKEN2WAV_OVERRIDES=1" and ours["max_num_seqs"] == 8
    for arm in (ours, upstream):
        if arm["status"] in ("ok", "partial"):
            level = arm["levels"]["1"]
            assert level["requests"] == REQUESTS and arm["peak_rss_bytes"] > 0 and arm["ready_after_s"] > 0
            if arm["status"] == "ok":
                assert level["failed"] == 0
                assert level["audio_s"] == pytest.approx(REQUESTS * TOKENS / 25)
                assert math.isfinite(level["ttfp_s"]["p50"]) and level["throughput_audio_s_per_s"] > 0
        else:
            assert arm["status"] in ("start_failed", "requests_failed"), arm
            assert arm["reason"] and arm["levels"] == {} and arm["log"], arm
    assert ours["status"] == "ok", ours
    assert proc.returncode == (0 if upstream["status"] == "ok" else 1), proc.stdout[-2000:]
    assert family["verdict"].startswith("step_audio2: ") and f"verdict: {family['verdict']}" in proc.stdout
    if upstream["status"] not in ("ok", "partial"):
        assert f"upstream {upstream['status']}" in family["verdict"]
    assert smoke["png"].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
