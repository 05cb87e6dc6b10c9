# SPDX-License-Identifier: Apache-2.0
"""Suite-wide conventions: hardware skips, mark enforcement, logging capture."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.log_capture import RootLogSnapshot
from tests.helpers.mark import HARDWARE_MARKS, LEVEL_MARKS, hardware_skip_reason

ROOT = Path(__file__).resolve().parents[1]
E2E_PREFIX = "tests/e2e/"
E2E_UNIT = "engine:e2e"
OTHER_ENGINE_UNIT = "engine:other"
ENGINE_UNITS = (E2E_UNIT, OTHER_ENGINE_UNIT)


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
    _check_engine_units(items)
    # The engine units first (stable: each keeps its order): the scheduler hands units out in collection order,
    # so each worker starts on one and the CPU-only modules fill in behind them.
    items.sort(key=lambda item: ENGINE_UNITS.index(unit) if (unit := work_unit(item.nodeid)) in ENGINE_UNITS else 2)
    if config.getoption("markexpr", ""):
        return
    higher = [item for item in items if not item.get_closest_marker(LEVEL_MARKS[0])]
    if higher:
        config.hook.pytest_deselected(items=higher)
        items[:] = [item for item in items if item.get_closest_marker(LEVEL_MARKS[0])]


def _check_engine_units(items: list[pytest.Item]) -> None:
    """Every real-engine test must sit in a module the xdist scheduler sees as one (`work_unit`), else it could
    run beside another engine of its own unit: fail the collection naming it instead."""
    stray = sorted(
        {item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("engine")}
        - {m for m in (item.nodeid.split("::", 1)[0] for item in items) if work_unit(m) in ENGINE_UNITS}
    )
    if stray:
        raise pytest.UsageError(
            "engine-marked tests in modules without a module-level `pytest.mark.engine` (the xdist scheduler "
            "reads that line to keep their engines in one ordered unit): " + ", ".join(stray)
        )


@functools.cache
def _needs_engine(module: str) -> bool:
    path = ROOT / module
    return path.is_file() and "pytest.mark.engine" in path.read_text()


def work_unit(nodeid: str) -> str:
    """The xdist work unit of a test: one of `ENGINE_UNITS` for a module that needs the real engine, else its module.

    Invariants: tests/e2e/ is one unit, in collection order, in one process (its package fixture launches the
    servers of every collected test that names one, while the folder's other tests run); every other module that
    needs the engine (a module-level `pytest.mark.engine`: the benchmarks' served smoke runs, the plugin and
    real-config tests) is the second unit, so at most two engine units run side by side (their start-ups also
    queue on upstream's host-wide lock); every other module is a unit of its own (its module-scoped fixtures are
    built once, as in a serial run). The controller sees node ids only (the workers collect), hence the source
    check.
    """
    module = nodeid.split("::", 1)[0]
    if module.startswith(E2E_PREFIX):
        return E2E_UNIT
    return OTHER_ENGINE_UNIT if _needs_engine(module) else module


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`-n 2` (pyproject): the two engine units (`work_unit`) on the two workers, each in order; the CPU-only
    modules fill in as a worker runs low.

    xdist's own `--dist loadgroup` cannot do this under pytest 9 (it renames `item._nodeid`, which pytest 9 no
    longer reads), so a scope scheduler with our work units replaces it.
    """
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # units in collection order (engine units first), not by size

    class EngineUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return EngineUnitScheduling(config, log)


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("hardware")
    if marker is None:
        return
    reason = hardware_skip_reason(marker.kwargs["res"], marker.kwargs.get("num_cards", 1))
    if reason is not None:
        pytest.skip(reason)


_ROOT_LOGS = pytest.StashKey[RootLogSnapshot]()


@pytest.hookimpl(trylast=True)  # after pytest's logging plugin has built its handlers
def pytest_configure(config: pytest.Config) -> None:
    config.stash[_ROOT_LOGS] = RootLogSnapshot.take(config)


@pytest.fixture(autouse=True)
def _restore_root_logging(request: pytest.FixtureRequest) -> None:
    """An in-process engine test can leave pytest's capture handlers at ERROR (`tests/helpers/log_capture.py`)."""
    snapshot = request.config.stash.get(_ROOT_LOGS, None)
    if snapshot is not None:
        snapshot.restore()


@pytest.fixture(autouse=True)
def _propagate_package_logs() -> Iterator[None]:
    """Let caplog see `vllm_omni_token2wav.*` records (the package root logger does not propagate by default)."""
    root = logging.getLogger("vllm_omni_token2wav")
    previous = root.propagate
    root.propagate = True
    yield
    root.propagate = previous
