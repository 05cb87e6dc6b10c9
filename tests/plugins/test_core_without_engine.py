# SPDX-License-Identifier: Apache-2.0
"""The core package works where neither vLLM nor vLLM-Omni is installed (they are optional)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

# A meta-path finder that makes `vllm` and `vllm_omni` (and their submodules) unimportable, as on a host
# without the engine; the rest of the environment is this one.
_BLOCK_ENGINE = """
import importlib.abc, sys
class _NoEngine(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("vllm", "vllm_omni"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoEngine())
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCK_ENGINE + textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )


def test_the_core_imports_and_builds_a_stage_model_without_the_engine() -> None:
    proc = _run(
        """
import vllm_omni_token2wav
from vllm_omni_token2wav.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav import MiniCPMO45Code2Wav
from vllm_omni_token2wav.model_executor.models.step_audio2.step_audio2_token2wav_stage import (
    StepAudio2Token2WavForConditionalGeneration,
)
from vllm_omni_token2wav.model_executor.models.cosyvoice3.cosyvoice3_code2wav import CosyVoice3Code2Wav
from vllm_omni_token2wav.model_executor.models.token2wav_stage.contract import build_output, SegmentResult
import torch
out = build_output([SegmentResult(audio=torch.zeros(4))], torch.device("cpu"))
assert type(out).__module__ == "vllm_omni_token2wav.model_executor.models.output_templates", type(out)
assert not any(m.split(".")[0] in ("vllm", "vllm_omni") for m in sys.modules)
print("ok")
"""
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_the_plugin_entry_points_do_nothing_harmful_without_vllm_omni() -> None:
    proc = _run(
        """
from vllm_omni_token2wav.plugins import register
register(); register()
print("ok")
"""
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
    assert "vLLM-Omni is not installed: nothing to register" in proc.stderr


def test_serve_without_the_engine_is_a_one_line_error() -> None:
    proc = _run(
        """
from vllm_omni_token2wav.entrypoints.cli.main import main
raise SystemExit(main(["serve", "some/model"]))
"""
    )
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stderr
    assert err[0].startswith("vllm-omni-token2wav: error: serving needs vLLM-Omni 0.30 and vLLM")
    assert "tools/install_engine_cpu.sh" in err[0]
