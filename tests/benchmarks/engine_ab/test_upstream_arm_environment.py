# SPDX-License-Identifier: Apache-2.0
"""The upstream arm's server environment: upstream's classes and the `cosyvoice2` its flow.yaml names.

Upstream's Step-Audio2 / MiniCPM-o token2wav builds its flow with hyperpyyaml from `flow.yaml`, whose tags
name `cosyvoice2.flow.flow.CausalMaskedDiffWithXvec` etc.; without a `cosyvoice2` on the engine workers'
path the upstream arm dies at load (`ImportError: There is no such class as cosyvoice2.flow.flow...`).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.engine import require_engine
from vllm_omni_token2wav.benchmarks.engine_ab.run import OVERRIDES_ENV, UPSTREAM_PATH, arm_environment

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

PROBE = "import cosyvoice2.flow.flow as f; print(f.CausalMaskedDiffWithXvec.__module__)"


def test_upstream_gets_the_switch_and_the_shim_path_ours_only_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    upstream, ours = arm_environment("0"), arm_environment("1")
    assert upstream[OVERRIDES_ENV] == "0" and ours == {OVERRIDES_ENV: "1"}
    assert upstream["PYTHONPATH"].split(os.pathsep) == [str(UPSTREAM_PATH), "/somewhere"]
    monkeypatch.delenv("PYTHONPATH")
    assert arm_environment("0")["PYTHONPATH"] == str(UPSTREAM_PATH)


def test_the_upstream_arms_path_makes_the_flow_yaml_classes_importable() -> None:
    require_engine("the upstream arm's cosyvoice2 shim", extra=("stepaudio2-minicpmo",))
    env = {**os.environ, **arm_environment("0")}
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().startswith("stepaudio2.cosyvoice2.flow"), proc.stdout
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    without = subprocess.run([sys.executable, "-c", PROBE], env=bare, capture_output=True, text=True, timeout=120)
    assert without.returncode != 0 and "cosyvoice2" in without.stderr
