# SPDX-License-Identifier: Apache-2.0
"""Platform detection: NPU only when torch_npu imports and reports a device; never a crash in auto mode."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.helpers.fake_npu import BROKEN_IMPORT_MESSAGE, install_broken_torch_npu, install_fake_torch_npu
from vllm_omni_token2wav import platforms
from vllm_omni_token2wav.platforms.detect import PLATFORM_ENV, detect_platform

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


@pytest.fixture(autouse=True)
def _fresh_platform(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(PLATFORM_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    platforms.reset_current_platform()
    yield
    platforms.reset_current_platform()


def test_missing_torch_npu_means_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import raises ImportError
    platform = detect_platform()
    assert platform.is_cpu() and not platform.is_npu() and not platform.is_cuda()
    assert platform.device_type == "cpu"
    assert platform.torch_device() == torch.device("cpu")


def test_available_fake_npu_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install_fake_torch_npu(monkeypatch, available=True, count=2)
    platform = detect_platform()
    assert platform.is_npu()
    assert platform.device_type == "npu"
    assert platform.device_count() == 2
    assert "fake" in platform.device_name
    platform.synchronize()
    assert fake.synchronize_calls == 1


def test_npu_present_but_no_device_is_not_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_torch_npu(monkeypatch, available=False)
    assert detect_platform().is_cpu()


def test_broken_torch_npu_is_not_npu_and_logs_debug(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    install_broken_torch_npu(monkeypatch, tmp_path)
    with caplog.at_level(logging.DEBUG, logger="vllm_omni_token2wav"):
        platform = detect_platform()
    assert platform.is_cpu()
    assert any(BROKEN_IMPORT_MESSAGE in r.getMessage() and r.levelno == logging.DEBUG for r in caplog.records)


def test_cuda_detected_when_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert detect_platform().is_cuda()


def test_override_cpu_wins_over_available_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_torch_npu(monkeypatch, available=True)
    monkeypatch.setenv(PLATFORM_ENV, "cpu")
    assert detect_platform().is_cpu()


def test_override_npu_without_torch_npu_raises_with_cause(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    install_broken_torch_npu(monkeypatch, tmp_path)
    monkeypatch.setenv(PLATFORM_ENV, "npu")
    with pytest.raises(RuntimeError, match="libhccl.so"):
        detect_platform()


def test_override_cuda_without_cuda_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLATFORM_ENV, "cuda")
    with pytest.raises(RuntimeError, match="CUDA is not usable"):
        detect_platform()


def test_override_invalid_value_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLATFORM_ENV, "tpu")
    with pytest.raises(ValueError, match="VLLM_OMNI_TOKEN2WAV_PLATFORM='tpu'"):
        detect_platform()


def test_current_platform_is_lazy_and_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_torch_npu(monkeypatch, available=True)
    first = platforms.current_omni_platform
    assert first is platforms.current_omni_platform
    assert first.is_npu()


def test_importing_vllm_omni_imports_no_accelerator_stacks() -> None:
    code = (
        "import sys, vllm_omni_token2wav, vllm_omni_token2wav.platforms, vllm_omni_token2wav.entrypoints.cli.main\n"
        "bad = [m for m in ('torch_npu', 'vllm', 'vllm_ascend') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
