# SPDX-License-Identifier: Apache-2.0
"""hardware_test adds platform marks and skips with a reason on hosts that lack the hardware."""

from __future__ import annotations

import pytest

from tests.helpers.mark import hardware_skip_reason, hardware_test
from vllm_omni_token2wav import platforms
from vllm_omni_token2wav.platforms.cpu.platform import CpuDevicePlatform

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]


def test_hardware_test_adds_platform_and_resource_marks() -> None:
    @hardware_test(res={"npu": "A2", "cuda": "H100"}, num_cards=2)
    def fn() -> None:
        pass

    names = {m.name: m for m in fn.pytestmark}  # type: ignore[attr-defined]
    assert {"npu", "cuda", "hardware"} <= set(names)
    assert names["hardware"].kwargs == {"res": {"npu": "A2", "cuda": "H100"}, "num_cards": 2}


def test_skip_reason_on_cpu_host_names_the_requirement() -> None:
    platforms.reset_current_platform(CpuDevicePlatform())
    try:
        reason = hardware_skip_reason({"npu": "A2"}, 1)
    finally:
        platforms.reset_current_platform()
    assert reason is not None and "npu (A2)" in reason and "serves on cpu" in reason


@pytest.mark.parametrize(("res", "cards"), [({}, 1), ({"tpu": "v5"}, 1), ({"npu": "A2"}, 0)])
def test_invalid_requirements_are_rejected(res: dict[str, str], cards: int) -> None:
    with pytest.raises(ValueError):
        hardware_test(res=res, num_cards=cards)
