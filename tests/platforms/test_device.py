# SPDX-License-Identifier: Apache-2.0
"""Device-spec normalisation: one explicit torch.device per physical device, clear errors otherwise."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from vllm_omni_token2wav import platforms
from vllm_omni_token2wav.platforms import device_key, normalize_device
from vllm_omni_token2wav.platforms.cpu.platform import CpuDevicePlatform

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


@pytest.fixture(autouse=True)
def _cpu_platform() -> Iterator[None]:
    platforms.reset_current_platform(CpuDevicePlatform())
    yield
    platforms.reset_current_platform()


@pytest.mark.parametrize("spec", ["cpu", "cpu:0", " cpu ", torch.device("cpu"), torch.device("cpu", 0), None])
def test_cpu_specs_have_no_index(spec: object) -> None:
    device = normalize_device(spec)  # type: ignore[arg-type]
    assert device == torch.device("cpu")
    assert device.index is None
    assert device_key(spec) == "cpu"  # type: ignore[arg-type]


@pytest.mark.parametrize("spec", ["cuda", "cuda:0", torch.device("cuda"), torch.device("cuda", 0)])
def test_cuda_specs_share_one_key(monkeypatch: pytest.MonkeyPatch, spec: object) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert normalize_device(spec) == torch.device("cuda", 0)  # type: ignore[arg-type]


def test_cuda_index_kept() -> None:
    assert normalize_device("cuda:3") == torch.device("cuda", 3)


def test_npu_without_backend_is_a_clear_error() -> None:
    if torch._C._get_privateuse1_backend_name() == "npu":
        pytest.skip("npu backend registered in this process")
    with pytest.raises(ValueError, match="is torch_npu installed"):
        normalize_device("npu:1")


@pytest.mark.parametrize(
    ("spec", "match"),
    [("", "empty string"), ("gpu", "invalid device spec 'gpu'"), ("cuda:x", "invalid device spec"), (-1, ">= 0")],
)
def test_invalid_specs_raise_value_error(spec: object, match: str) -> None:
    if spec == -1:
        platforms.reset_current_platform(_IndexedPlatform())
    with pytest.raises(ValueError, match=match):
        normalize_device(spec)  # type: ignore[arg-type]


@pytest.mark.parametrize("spec", [1.5, object(), True, ["cpu"]])
def test_wrong_types_raise_value_error(spec: object) -> None:
    with pytest.raises(ValueError, match="device spec must be"):
        normalize_device(spec)  # type: ignore[arg-type]


def test_int_on_cpu_platform_is_rejected() -> None:
    with pytest.raises(ValueError, match="no index"):
        normalize_device(0)


class _IndexedPlatform(CpuDevicePlatform):
    device_type = "cuda"

    def current_device_index(self) -> int | None:
        return 2


def test_none_and_int_use_the_serving_platform() -> None:
    platforms.reset_current_platform(_IndexedPlatform())
    assert normalize_device(None) == torch.device("cuda", 2)
    assert normalize_device(1) == torch.device("cuda", 1)
