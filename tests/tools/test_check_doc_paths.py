# SPDX-License-Identifier: Apache-2.0
"""`tools/check_doc_paths.py` flags a backticked path that is gone and accepts the ones that exist.

Each test builds a small git repository (a package, tests, a doc) so the findings depend on nothing in
this checkout; one test runs the real command line on this repository's layout.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools import check_doc_paths

ROOT = Path(__file__).resolve().parents[2]
PKG = "vllm_omni_token2wav"

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def _git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
        cwd=root,
        check=True,
        capture_output=True,
    )


def _repo(tmp_path: Path, files: dict[str, str]) -> Path:
    """A committed repository with `files`, plus a package layout the search roots point into."""
    base = {
        f"{PKG}/__init__.py": '"""Package."""\n',
        f"{PKG}/model_executor/layers/flow/batched.py": '"""Rows of many requests."""\nclass FlowRowState: ...\n',
        f"{PKG}/model_executor/models/standin/model_dirs.py": '"""Stand-in folders."""\n',
        f"{PKG}/model_executor/models/token2wav_core/core.py": '"""The shared core."""\n',
        "tests/model_executor/layers/flow/test_batched.py": '"""Rows."""\n',
        "docs/design/other.md": "# Other\n",
        "tools/run.sh": "# SPDX-License-Identifier: Apache-2.0\n",
    }
    for rel, body in {**base, **files}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "tree")
    return tmp_path


def _findings(root: Path) -> list[str]:
    tree = check_doc_paths.Tree.read(root)
    return [str(f) for rel in check_doc_paths.checked_files(tree) for f in check_doc_paths.check_file(rel, tree)]


def test_existing_paths_in_every_spelling_pass(tmp_path: Path) -> None:
    doc = (
        "# Design\n"
        "`vllm_omni_token2wav/model_executor/layers/flow/batched.py`, `layers/flow/batched.py:FlowRowState`,\n"
        "`layers/flow/batched.FlowRowState`, `token2wav_core/core.py` and `standin/` (models/),\n"
        "`layers/flow/test_batched.py` (the mirror test), `other.md`, `../design/other.md`, `tools/run.sh`,\n"
        "`layers/flow/{batched,test_batched}.py`, `tests/.../flow/test_batched.py`, `bash tools/run.sh --x`.\n"
    )
    code = '"""Reads `standin/model_dirs.py` and `layers/flow/`."""\n# see `token2wav_core/core.py`\n'
    root = _repo(tmp_path, {"docs/design/a.md": doc, f"{PKG}/model_executor/models/token2wav_core/x.py": code})
    assert _findings(root) == []


def test_upstream_runtime_and_non_paths_are_not_checked(tmp_path: Path) -> None:
    doc = (
        "`vllm_omni/deploy/cosyvoice3.yaml`, `vllm/engine/arg_utils.py`, `cosyvoice/flow/flow.py`, "
        "`M/token2wav`, `~/.cache/x/y.json`, `$HOME/a/b.py`, `/tmp/x.json`, `out/report.json`,\n"
        "`https://example.org/a.py`, `benchmarks/results/<stem>.json`, `tests/**/test_*.py`, `audio/mpeg`,\n"
        "`tokens/s`, `config.yaml`, `engine.py`, `hifigan/generator.py`, `assets/token2wav/`, `1/T`.\n"
    )
    assert _findings(_repo(tmp_path, {"README.md": doc})) == []


def test_missing_paths_are_reported_with_file_and_line(tmp_path: Path) -> None:
    doc = "# Design\n\nThe flow is `layers/flow/streaming.py`; rows in `layers/flow/{batched,gone}.py`.\n"
    code = (
        '"""Module.\n\nUses `token2wav_core/missing.py`.\n"""\n\n\n'
        "def f() -> None:\n"
        '    """Calls `standin/nowhere.py`."""\n'
        "    # see `vllm_omni_token2wav/model_executor/models/cosyvoice3/`\n"
    )
    root = _repo(tmp_path, {"docs/design/a.md": doc, f"{PKG}/model_executor/models/token2wav_core/x.py": code})
    x = f"{PKG}/model_executor/models/token2wav_core/x.py"
    assert sorted(_findings(root)) == sorted(
        [
            "docs/design/a.md:3: `layers/flow/streaming.py` does not exist",
            "docs/design/a.md:3: `layers/flow/gone.py` does not exist",
            f"{x}:3: `token2wav_core/missing.py` does not exist",
            f"{x}:8: `standin/nowhere.py` does not exist",
            f"{x}:9: `vllm_omni_token2wav/model_executor/models/cosyvoice3/` does not exist",
        ]
    )


def test_bare_name_of_a_removed_file_is_reported(tmp_path: Path) -> None:
    root = _repo(tmp_path, {f"{PKG}/model_executor/models/step_audio2/standin.py": '"""Old home."""\n'})
    (root / f"{PKG}/model_executor/models/step_audio2/standin.py").unlink()
    (root / "docs/design/a.md").write_text("Built by `standin.py`; `cosyvoice2/flow/x.py` is upstream's.\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "remove")
    assert _findings(root) == ["docs/design/a.md:1: `standin.py` does not exist"]


def test_marker_and_fenced_blocks_opt_out(tmp_path: Path) -> None:
    doc = (
        "Was `models/cosyvoice2/flow/` before the move. <!-- doc-paths: ignore -->\n"
        "```\n`layers/flow/gone.py` in a fenced block\n```\n"
    )
    code = "# moved from `layers/flow/old.py`  doc-paths: ignore\n"
    assert _findings(_repo(tmp_path, {"docs/design/a.md": doc, "tools/x.py": code})) == []


def test_codeowners_folders_must_exist(tmp_path: Path) -> None:
    owners = (
        "*  @team\n"
        f"/{PKG}/model_executor/layers/  @team/synthesis\n"
        f"/{PKG}/model_executor/models/cosyvoice3/  @team/speaker  # gone\n"
        "*.md  @team/docs\n"
    )
    root = _repo(tmp_path, {"CODEOWNERS": owners})
    assert _findings(root) == [f"CODEOWNERS:3: `/{PKG}/model_executor/models/cosyvoice3/` does not exist"]


def test_command_line_exit_status_and_output(tmp_path: Path) -> None:
    root = _repo(tmp_path, {"README.md": "Run `python tools/gone.py --all`.\n"})
    script = ROOT / "tools" / "check_doc_paths.py"
    proc = subprocess.run([sys.executable, str(script), "--root", str(root)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stdout == "README.md:1: `tools/gone.py` does not exist\n"
    (root / "README.md").write_text("Run `bash tools/run.sh`.\n")
    proc = subprocess.run(
        [sys.executable, str(script), "--root", str(root), str(root / "README.md")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_path_that_leaves_the_repository_never_exists(tmp_path: Path) -> None:
    """A path to `notes/x.md` beside the root names a file outside the checkout: found here, absent in a fresh clone, so
    it counts as missing everywhere (a docs-relative `../` that stays inside still resolves)."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "x.md").write_text("outside\n")
    root = _repo(
        tmp_path / "repo",
        {
            f"{PKG}/contract.py": '"""The contract (`../notes/x.md`)."""\n',
            "docs/design/a.md": "See `../design/other.md`.\n",
        },
    )
    findings = _findings(root)
    assert [f for f in findings if "../notes/x.md" in f] and not [f for f in findings if "other.md" in f], findings
