# SPDX-License-Identifier: Apache-2.0
"""The real engine serving a Hugging Face repo id offline: Step-Audio2's code2wav stage alone from a hub cache.

`vllm-omni serve stepfun-ai/Step-Audio-2-mini --omni` with `HF_HUB_OFFLINE=1`, from the cache
`HF_HUB_CACHE` names, laid out the standard way with blobs and symlinks (`tests/helpers/hub_cache.py`)
around the stand-in engine folder: `config.json` (vLLM's config), `model.safetensors` (vLLM's default
loader; the stage drains it) and `token2wav/` (the stage's assets and default voice).

Under `HF_HUB_OFFLINE` vLLM 0.30 replaces the id by its cached snapshot folder before any stage is built
(`vllm/engine/arg_utils.py`, "HF_HUB_OFFLINE is True, replace model_id"), so the stage gets a local
folder here; online, vLLM-Omni's `AsyncOmni` downloads the whole repo and keeps the id
(`omni_base.omni_snapshot_download`), and the stage resolves the id itself (`token2wav_stage/model_source.py`,
tested on every family offline in tests/model_executor/models/token2wav_stage/test_hub_model.py; the engine's
online path needs the hub, which no test reaches).

huggingface_hub reads `HF_HUB_OFFLINE` / `HF_HUB_CACHE` when it is imported, and this process has
imported it already (vLLM does); the engine therefore runs in a fresh Python process started with
them set (`_ENGINE_SCRIPT`), as a user's shell would start `vllm-omni serve`. Its requests' audio must
equal our stage class run here on the local folder (<= 1e-5, equal length).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.references import max_abs, reference_stage, whole_request
from tests.helpers.engine import require_engine
from tests.helpers.hub_cache import add_snapshot, commit_hash, folder_files

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the hub repo id engine test")

REPO_ROOT = Path(__file__).resolve().parents[2]
REPO_ID = "stepfun-ai/Step-Audio-2-mini"
TOLERANCE = 1e-5
ENGINE_TIMEOUT_S = 540

_ENGINE_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path

    import numpy as np

    assert "huggingface_hub" not in sys.modules
    from tests.e2e.engines import FAST_STAGE_OPTIONS, OfflineEngine, deployment

    out_dir, requests = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    start = time.monotonic()
    deploy = deployment(out_dir, "step_audio2_code2wav", {0: {"additional_config": FAST_STAGE_OPTIONS}})
    engine = OfflineEngine(sys.argv[3], deploy, out_dir / "stage_stats.json")
    started = time.monotonic()
    try:
        outcomes = engine.run({rid: (prompt, None) for rid, prompt in requests.items()})
        for rid, outcome in outcomes.items():
            np.save(out_dir / f"{rid}.npy", outcome.final)
    finally:
        engine.close()
    print(json.dumps({"start_s": started - start, "requests_s": time.monotonic() - started}))
    """
)


def test_the_engine_serves_a_hub_repo_id_offline_from_the_cache(tmp_path: Path) -> None:
    from vllm_omni_token2wav.model_executor.models.standin.model_dirs import ensure_engine_model_dir

    local = ensure_engine_model_dir("step_audio2")
    cache = tmp_path / "hub"
    files = folder_files(local, skip=("standin_producer/",))  # config.json, model.safetensors, token2wav/*
    snapshot = add_snapshot(cache, REPO_ID, files, revision=commit_hash("engine"), blobs=True)
    rng = np.random.default_rng(7)
    requests = {
        f"hub{i}": {"prompt_token_ids": rng.integers(0, 6561, n).tolist(), "additional_information": {"seed": 40 + i}}
        for i, n in enumerate((31, 58))
    }
    (tmp_path / "requests.json").write_text(json.dumps(requests))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env |= {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(tmp_path / "hf_home")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", _ENGINE_SCRIPT, str(tmp_path), str(tmp_path / "requests.json"), REPO_ID],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_S,
        start_new_session=True,
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-6000:])
    timing = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"engine on a hub id: {time.monotonic() - began:.1f} s wall, {timing}")
    stats = json.loads((tmp_path / "stage_stats.json").read_text())
    assert stats["errors"] == 0, stats
    log = done.stdout + done.stderr
    # vLLM itself swaps the id for the snapshot under HF_HUB_OFFLINE (module docstring); the stage read that snapshot.
    assert f"replace model_id [{REPO_ID}] to model_path [{snapshot}]" in log, log[-4000:]
    assert f"loaded flow model from {snapshot}/token2wav/flow.pt" in log, log[-4000:]
    reference = reference_stage("step_audio2", local, async_chunk=False)
    for rid, prompt in requests.items():
        got = np.load(tmp_path / f"{rid}.npy")
        want = whole_request(reference, rid, prompt["prompt_token_ids"], prompt["additional_information"])
        assert got.shape == want.shape == (960 * len(prompt["prompt_token_ids"]),), rid
        assert max_abs(got, want) <= TOLERANCE, rid
