# SPDX-License-Identifier: Apache-2.0
"""Keep pytest's log capture working after a library reconfigures the root logger in the test process.

Importing `vllm.entrypoints.openai.api_server` (vLLM 0.30 via `model_hosting_container_standards`) runs
`configure_root_logger()`, which sets the root logger to ERROR and raises the level of *every handler then on
the root logger* to ERROR. pytest's capture handlers (`caplog`, the per-test report, the log file and live
handlers) are created once per session and attached to the root logger around each phase, so an in-process
engine test that imports the API server silences every later WARNING/INFO `caplog` assertion in the same
worker process (measured: one failing `caplog` test on the xdist worker that had run an in-process engine
test first).

`RootLogSnapshot` records the root logger's level and pytest's handlers' levels once at configure time;
`restore()` puts them back before each test. Nothing else in the logging tree is touched.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

_HANDLER_ATTRS = ("caplog_handler", "report_handler", "log_file_handler", "log_cli_handler")


@dataclass
class RootLogSnapshot:
    """The root logger's level and pytest's capture handlers' levels as pytest configured them."""

    root_level: int
    handler_levels: list[tuple[logging.Handler, int]] = field(default_factory=list)

    @classmethod
    def take(cls, config: pytest.Config) -> RootLogSnapshot:
        plugin = config.pluginmanager.get_plugin("logging-plugin")
        handlers = [getattr(plugin, name, None) for name in _HANDLER_ATTRS] if plugin is not None else []
        return cls(
            root_level=logging.getLogger().level,
            handler_levels=[(h, h.level) for h in handlers if isinstance(h, logging.Handler)],
        )

    def drift(self) -> list[str]:
        """What changed since the snapshot, one line each (empty when nothing did)."""
        changes = []
        root = logging.getLogger()
        if root.level != self.root_level:
            changes.append(f"root logger level {self.root_level} -> {root.level}")
        changes += [
            f"{type(h).__name__} level {level} -> {h.level}" for h, level in self.handler_levels if h.level != level
        ]
        return changes

    def restore(self) -> None:
        logging.getLogger().setLevel(self.root_level)
        for handler, level in self.handler_levels:
            handler.setLevel(level)
