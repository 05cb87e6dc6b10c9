# SPDX-License-Identifier: Apache-2.0
"""The toy recorder: upstream's async-chunk functions, wrapped, record each payload and return it unchanged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

require_engine("the toy recorder (upstream's stage input processors)")

from vllm_omni_token2wav.model_executor.models.standin.toy import recorder, site_pythonpath  # noqa: E402

MODULE = "vllm_omni.model_executor.stage_input_processors.step_audio2"


def test_without_the_variable_nothing_is_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    monkeypatch.delenv(recorder.RECORD_ENV, raising=False)
    module = importlib.import_module(MODULE)
    before = module.thinker2token2wav_async_chunk
    recorder.install()
    assert module.thinker2token2wav_async_chunk is before


_CHILD = """
import json, sys
from tests.e2e.references import replay_chunks  # calls the module's function by import, once per step
chunks = replay_chunks("step_audio2", "req-1", [1, 2], [151696 + i for i in range(30)])
print(json.dumps([[list(c.tokens), c.last] for c in chunks]))
"""


def test_a_process_started_with_the_site_folder_records_every_payload(tmp_path: Path) -> None:
    """A fresh interpreter with `SITE_DIR` on PYTHONPATH (as an engine process): the records are the payloads."""
    import json
    import os

    repo = Path(__file__).resolve().parents[5]
    env = dict(os.environ)
    env["PYTHONPATH"] = site_pythonpath(os.pathsep.join(p for p in (str(repo), env.get("PYTHONPATH")) if p))
    env[recorder.RECORD_ENV] = str(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, cwd=repo, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    returned = json.loads(proc.stdout.strip().splitlines()[-1])
    records = recorder.read_records(tmp_path)
    assert list(records) == ["req-1"]
    assert [[r["codes"], r["last"]] for r in records["req-1"]] == returned
    assert [len(c) for c, _ in returned] == [28, 5] and returned[-1][1] is True
    assert {r["function"] for r in records["req-1"]} == {"thinker2token2wav_async_chunk"}
