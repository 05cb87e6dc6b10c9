# SPDX-License-Identifier: Apache-2.0
"""The suite's log-capture guard undoes what vLLM's API-server import does to the root logger's handlers."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable

import pytest

from tests.helpers.log_capture import RootLogSnapshot
from vllm_omni_token2wav.logger import init_logger

pytestmark = [pytest.mark.core_model, pytest.mark.cpu]

logger = init_logger(__name__)


def _like_configure_root_logger() -> None:
    """What vLLM 0.30's API-server import does (model_hosting_container_standards.configure_root_logger)."""
    root = logging.getLogger()
    root.setLevel(logging.ERROR)
    for handler in root.handlers:
        handler.setLevel(max(handler.level, logging.ERROR))


def _real_configure_root_logger() -> None:
    from model_hosting_container_standards.logging_config import configure_root_logger

    configure_root_logger()


DAMAGES: list[Callable[[], None]] = [_like_configure_root_logger]
if importlib.util.find_spec("model_hosting_container_standards") is not None:  # installed with the engine
    DAMAGES.append(_real_configure_root_logger)


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda f: f.__name__.strip("_"))
def test_restore_gives_caplog_back_its_warnings(
    damage: Callable[[], None], request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    snapshot = RootLogSnapshot.take(request.config)
    assert snapshot.handler_levels, "pytest's logging plugin handlers were not found"
    try:
        damage()
        logger.warning("while damaged")
        assert "while damaged" not in caplog.text  # the failure the guard exists for
        assert snapshot.drift()
    finally:
        snapshot.restore()
    assert snapshot.drift() == []
    logger.warning("after restore")
    assert "after restore" in caplog.text
