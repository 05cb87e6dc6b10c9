# SPDX-License-Identifier: Apache-2.0
"""`python -m ...standin.toy FAMILY`: the README's way to lay out a toy upstream pipeline and serve it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.helpers.engine import require_engine
from vllm_omni_token2wav.model_executor.models.standin.toy.__main__ import main

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the toy pipeline CLI test")


def test_prints_the_folder_the_overlay_over_upstreams_yaml_and_the_serve_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["step_audio2", "--out", str(tmp_path)]) == 0
    folder, deploy, command = capsys.readouterr().out.strip().splitlines()
    model_dir = Path(folder.split(": ", 1)[1].strip())
    deploy_path = Path(deploy.split(": ", 1)[1].strip())
    assert (model_dir / "config.json").is_file() and deploy_path.parent == tmp_path
    overlay = yaml.safe_load(deploy_path.read_text())
    assert Path(overlay["base_config"]).name == "step_audio_2_async_chunk.yaml"  # upstream's own file, not a copy
    assert "site-packages/vllm_omni/deploy" in overlay["base_config"].replace("\\", "/")
    assert command == f"vllm-omni-token2wav serve {model_dir} --deploy-config {deploy_path}"
