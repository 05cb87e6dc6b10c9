# SPDX-License-Identifier: Apache-2.0
"""Test marks: a level and a hardware requirement on every test.

Levels: `core_model` (the CPU suite CI runs on every change), `advanced_model`, `full_model`.
Hardware: `pytest.mark.cpu` for tests that run anywhere, or `hardware_test(res=..., num_cards=...)`
for tests that need an accelerator; it adds the platform marks (`npu`, `cuda`) and a `hardware`
mark that `tests/conftest.py` turns into a skip with a reason when this host cannot satisfy it.

    @pytest.mark.core_model
    @hardware_test(res={"npu": "A2", "cuda": "H100"}, num_cards=1)
    def test_parity_on_device(): ...

`res` maps a platform to the resource the test was sized for; any listed platform with at least
`num_cards` devices satisfies it (the resource name is recorded for reports, not enforced).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import pytest

LEVEL_MARKS = ("core_model", "advanced_model", "full_model")
HARDWARE_MARKS = ("cpu", "cuda", "npu")
_PLATFORMS = ("cuda", "npu")

F = TypeVar("F", bound=Callable[..., Any])


def hardware_test(res: Mapping[str, str], num_cards: int = 1) -> Callable[[F], F]:
    """Mark a test as needing one of the platforms in `res` with `num_cards` devices."""
    unknown = sorted(set(res) - set(_PLATFORMS))
    if not res or unknown:
        raise ValueError(f"hardware_test(res=...) needs keys from {_PLATFORMS}, got {sorted(res)}")
    if num_cards < 1:
        raise ValueError(f"hardware_test(num_cards=...) must be >= 1, got {num_cards}")

    def decorate(obj: F) -> F:
        for platform in res:
            obj = getattr(pytest.mark, platform)(obj)
        return pytest.mark.hardware(res=dict(res), num_cards=num_cards)(obj)

    return decorate


def hardware_skip_reason(res: Mapping[str, str], num_cards: int) -> str | None:
    """None when this host satisfies the requirement, else the reason to skip."""
    from vllm_omni_token2wav.platforms import get_current_platform

    platform = get_current_platform()
    wanted = ", ".join(f"{p} ({r})" for p, r in res.items())
    if platform.device_type not in res:
        return f"needs {num_cards} x one of [{wanted}]; this host serves on {platform.device_type}"
    count = platform.device_count()
    if count < num_cards:
        return f"needs {num_cards} {platform.device_type} device(s) ({res[platform.device_type]}); found {count}"
    return None
