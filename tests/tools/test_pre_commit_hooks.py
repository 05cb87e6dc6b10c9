# SPDX-License-Identifier: Apache-2.0
"""The project's own hooks reject what they must and accept what they must."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKS_HOOK = ROOT / "tools" / "pre_commit" / "check_test_marks.py"
SPDX_HOOK = ROOT / "tools" / "pre_commit" / "check_spdx.py"

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def _run(hook: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(hook), *map(str, files)], capture_output=True, text=True)


def _write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def test_marks_hook_rejects_unmarked_test(tmp_path: Path) -> None:
    path = _write(tmp_path, "test_plain.py", "def test_x():\n    assert True\n")
    proc = _run(MARKS_HOOK, path)
    assert proc.returncode == 1
    assert "test_x needs a level mark" in proc.stderr and "a hardware mark" in proc.stderr


def test_marks_hook_rejects_level_only(tmp_path: Path) -> None:
    body = "import pytest\n\n@pytest.mark.core_model\ndef test_x():\n    pass\n"
    proc = _run(MARKS_HOOK, _write(tmp_path, "test_level.py", body))
    assert proc.returncode == 1 and "hardware mark" in proc.stderr and "level mark" not in proc.stderr


def test_marks_hook_accepts_module_marks(tmp_path: Path) -> None:
    body = "import pytest\n\npytestmark = [pytest.mark.core_model, pytest.mark.cpu]\n\ndef test_x():\n    pass\n"
    assert _run(MARKS_HOOK, _write(tmp_path, "test_ok.py", body)).returncode == 0


def test_marks_hook_accepts_hardware_test_and_class_marks(tmp_path: Path) -> None:
    body = (
        "import pytest\nfrom tests.helpers.mark import hardware_test\n\n"
        "@pytest.mark.full_model\nclass TestDevice:\n"
        "    @hardware_test(res={'npu': 'A2'})\n    def test_y(self):\n        pass\n"
    )
    assert _run(MARKS_HOOK, _write(tmp_path, "test_cls.py", body)).returncode == 0


def test_marks_hook_rejects_partially_marked_class(tmp_path: Path) -> None:
    body = (
        "import pytest\n\n@pytest.mark.core_model\nclass TestX:\n"
        "    @pytest.mark.cpu\n    def test_a(self):\n        pass\n"
        "    def test_b(self):\n        pass\n"
    )
    proc = _run(MARKS_HOOK, _write(tmp_path, "test_partial.py", body))
    assert proc.returncode == 1 and "TestX.test_b" in proc.stderr and "TestX.test_a" not in proc.stderr


def test_spdx_hook_rejects_missing_header(tmp_path: Path) -> None:
    path = _write(tmp_path, "mod.py", '"""Docstring."""\n')
    proc = _run(SPDX_HOOK, path)
    assert proc.returncode == 1 and "missing 'SPDX-License-Identifier:" in proc.stderr


def test_spdx_hook_accepts_header_after_shebang(tmp_path: Path) -> None:
    path = _write(tmp_path, "tool.py", "#!/usr/bin/env python3\n# SPDX-License-Identifier: Apache-2.0\n")
    assert _run(SPDX_HOOK, path).returncode == 0


def test_spdx_hook_checks_extensionless_shell_scripts(tmp_path: Path) -> None:
    path = _write(tmp_path, "run", "#!/usr/bin/env bash\nset -e\n")
    assert _run(SPDX_HOOK, path).returncode == 1
    assert _run(SPDX_HOOK, _write(tmp_path, "notes.txt", "no header\n")).returncode == 0


def test_whole_repository_passes_both_hooks() -> None:
    tests = sorted((ROOT / "tests").rglob("test_*.py"))
    assert subprocess.run([sys.executable, str(MARKS_HOOK), *map(str, tests)], cwd=ROOT).returncode == 0
    assert subprocess.run([sys.executable, str(SPDX_HOOK)], cwd=ROOT).returncode == 0
