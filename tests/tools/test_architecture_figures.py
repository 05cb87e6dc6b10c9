# SPDX-License-Identifier: Apache-2.0
"""`tools/architecture_figures.py` counts what it claims: lines, families, and crossing imports (at a synthetic
package through git, and at the working tree, where the layer test already requires zero crossings)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tools.architecture_figures import figures

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

REPO = Path(__file__).resolve().parents[2]


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_counts_crossing_imports_at_a_git_revision(tmp_path: Path) -> None:
    models = "vllm_omni_token2wav/model_executor/models"
    _write(tmp_path, f"{models}/alpha/family.py", "X = 1\n")
    _write(tmp_path, f"{models}/alpha/facade.py", "from vllm_omni_token2wav.model_executor.models.beta.b import B\n")
    _write(tmp_path, f"{models}/beta/family.py", "class B:\n    pass\n")
    _write(tmp_path, f"{models}/beta/b.py", "class B:\n    x = 1\n    y = 2\n")
    _write(
        tmp_path,
        f"{models}/core/c.py",
        "def f():\n    from vllm_omni_token2wav.model_executor.models.alpha.facade import A\n",
    )
    _write(tmp_path, f"{models}/standin/s.py", "from vllm_omni_token2wav.model_executor.models.beta.b import B\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "."], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=tmp_path, check=True)
    fig = figures("HEAD", tmp_path)
    assert fig.files_per_family == {"alpha": 2, "beta": 2}
    assert [f.split(" -> ")[0] for f in fig.family_to_family] == ["model_executor/models/alpha/facade.py:1"]
    assert [f.split(" -> ")[0] for f in fig.shared_to_family] == ["model_executor/models/core/c.py:2"]  # lazy too
    assert fig.total_lines == 10 and fig.largest_classes[0] == (3, "model_executor/models/beta/b.py:B")


def test_the_working_tree_has_no_crossing_imports() -> None:
    fig = figures(None, REPO)
    assert set(fig.files_per_family) >= {"step_audio2", "minicpmo_4_5", "cosyvoice3"}
    assert fig.family_to_family == [] and fig.shared_to_family == []
