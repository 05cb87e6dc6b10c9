# SPDX-License-Identifier: Apache-2.0
"""`token2wav_spk_backend`: the one serving policy (`selection.stage_backend_request`) and the stage option."""

from __future__ import annotations

import pytest

from vllm_omni_token2wav.model_executor.models.speaker_embedding.selection import (
    SPK_BACKEND_OPTIONS,
    stage_backend_request,
)
from vllm_omni_token2wav.model_executor.models.token2wav_stage.options import StageOptions
from vllm_omni_token2wav.platforms.cpu.platform import CpuDevicePlatform
from vllm_omni_token2wav.platforms.cuda.platform import CudaDevicePlatform
from vllm_omni_token2wav.platforms.npu.platform import NpuDevicePlatform

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

_PLATFORMS = {"npu": NpuDevicePlatform(), "cuda": CudaDevicePlatform(), "cpu": CpuDevicePlatform()}

# The table of `stage_backend_request`'s docstring, written out independently of the code.
_EXPECTED = {
    ("auto", "npu"): "device",
    ("auto", "cuda"): "device",
    ("auto", "cpu"): "fallback",
    ("device", "npu"): "device",
    ("device", "cuda"): "device",
    ("device", "cpu"): "device",
    ("graphed", "npu"): "graphed",
    ("graphed", "cuda"): "graphed",
    ("graphed", "cpu"): "graphed",
    ("tensorrt", "cuda"): "tensorrt",
    ("onnxruntime", "npu"): "fallback",
    ("onnxruntime", "cuda"): "fallback",
    ("onnxruntime", "cpu"): "fallback",
}


@pytest.mark.parametrize(("option", "platform"), sorted(_EXPECTED))
def test_the_policy_table(option: str, platform: str) -> None:
    assert stage_backend_request(option, _PLATFORMS[platform]) == _EXPECTED[(option, platform)]


def test_every_option_is_covered_and_case_is_ignored() -> None:
    assert {option for option, _ in _EXPECTED} == set(SPK_BACKEND_OPTIONS)
    assert stage_backend_request(" Auto ", _PLATFORMS["cuda"]) == "device"


def test_the_stage_option_defaults_to_auto_and_rejects_unknown_values() -> None:
    assert StageOptions().spk_backend == "auto"
    assert StageOptions(spk_backend="ONNXRuntime").spk_backend == "onnxruntime"
    with pytest.raises(ValueError, match=r"token2wav_spk_backend must be one of auto, device, graphed.*'cuda'"):
        StageOptions(spk_backend="cuda")
