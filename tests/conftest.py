# SPDX-License-Identifier: Apache-2.0
"""Suite-wide conventions: hardware skips, mark enforcement, logging capture."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tests.helpers.mark import HARDWARE_MARKS, LEVEL_MARKS, hardware_skip_reason


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test needs a level and a hardware mark (the pre-commit hook checks the same statically).

    Without `-m`, only the `core_model` level runs (what CI runs: `pytest tests`); the higher levels
    (full-size models, minutes each) are deselected and run when asked for, e.g. `-m advanced_model`.
    """
    missing = []
    for item in items:
        names = {m.name for m in item.iter_markers()}
        if not names & set(LEVEL_MARKS) or not names & set(HARDWARE_MARKS):
            missing.append(item.nodeid)
    if missing:
        raise pytest.UsageError(
            "tests without a level mark (core_model/advanced_model/full_model) and a hardware mark "
            "(cpu or hardware_test): " + ", ".join(missing[:20])
        )
    if config.getoption("markexpr", ""):
        return
    higher = [item for item in items if not item.get_closest_marker(LEVEL_MARKS[0])]
    if higher:
        config.hook.pytest_deselected(items=higher)
        items[:] = [item for item in items if item.get_closest_marker(LEVEL_MARKS[0])]


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("hardware")
    if marker is None:
        return
    reason = hardware_skip_reason(marker.kwargs["res"], marker.kwargs.get("num_cards", 1))
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(autouse=True)
def _propagate_package_logs() -> Iterator[None]:
    """Let caplog see `vllm_omni_token2wav.*` records (the package root logger does not propagate by default)."""
    root = logging.getLogger("vllm_omni_token2wav")
    previous = root.propagate
    root.propagate = True
    yield
    root.propagate = previous
