# SPDX-License-Identifier: Apache-2.0
"""Levels: a run without `-m` (CI's `pytest tests`) collects only `core_model`; `-m LEVEL` selects a higher one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

ROOT = Path(__file__).resolve().parents[1]


def _collect(tmp_path: Path, *options: str) -> str:
    module = tmp_path / "test_levels_sample.py"
    module.write_text(
        "import pytest\n"
        "@pytest.mark.core_model\n@pytest.mark.cpu\ndef test_core(): pass\n"
        "@pytest.mark.advanced_model\n@pytest.mark.cpu\ndef test_advanced(): pass\n"
        "@pytest.mark.full_model\n@pytest.mark.cpu\ndef test_full(): pass\n"
    )
    # the suite's conftest as a plugin, the project's pytest config (markers), the sample outside tests/
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest"]
        + ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), *options, str(module)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
    )
    return done.stdout


def test_without_m_only_core_model_is_collected(tmp_path: Path) -> None:
    out = _collect(tmp_path)
    assert "::test_core" in out and "::test_advanced" not in out and "::test_full" not in out, out
    assert "1/3 tests collected (2 deselected)" in out, out


def test_m_selects_a_higher_level(tmp_path: Path) -> None:
    out = _collect(tmp_path, "-m", "advanced_model")
    assert "::test_advanced" in out and "::test_core" not in out and "::test_full" not in out, out
