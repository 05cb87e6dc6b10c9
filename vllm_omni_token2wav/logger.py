# SPDX-License-Identifier: Apache-2.0
"""Package logging, shaped like vLLM's `vllm.logger.init_logger`.

Every module does `logger = init_logger(__name__)` and logs with %-style arguments. All loggers
hang below the `vllm_omni_token2wav` root logger, which gets one stream handler the first time a logger is
created (unless the application configured logging itself). The level comes from the
`VLLM_OMNI_TOKEN2WAV_LOGGING_LEVEL` environment variable (default INFO).

`logger.warning_once(...)` / `logger.info_once(...)` log a given message (format + args) once per
process: use them for per-step conditions on hot paths.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any, cast

_ROOT_NAME = "vllm_omni_token2wav"
_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
_DATE_FORMAT = "%m-%d %H:%M:%S"
LOGGING_LEVEL_ENV = "VLLM_OMNI_TOKEN2WAV_LOGGING_LEVEL"

_configure_lock = threading.Lock()
_configured = False
# Process-wide set of (level, msg, args) already emitted by the *_once helpers; guarded by a lock
# because stage workers log from several threads.
_once_lock = threading.Lock()
_once_seen: set[tuple[int, str, tuple[Any, ...]]] = set()


class OmniLogger(logging.Logger):
    """A `logging.Logger` with vLLM's `*_once` helpers."""

    def _log_once(self, level: int, msg: str, args: tuple[Any, ...]) -> None:
        try:
            key = (level, msg, tuple(args))
            hash(key)
        except TypeError:
            key = (level, msg, tuple(repr(a) for a in args))
        with _once_lock:
            if key in _once_seen:
                return
            _once_seen.add(key)
        self.log(level, msg, *args, stacklevel=3)

    def warning_once(self, msg: str, *args: Any) -> None:
        self._log_once(logging.WARNING, msg, args)

    def info_once(self, msg: str, *args: Any) -> None:
        self._log_once(logging.INFO, msg, args)

    def debug_once(self, msg: str, *args: Any) -> None:
        self._log_once(logging.DEBUG, msg, args)


def _configure_root() -> None:
    global _configured
    with _configure_lock:
        if _configured:
            return
        root = logging.getLogger(_ROOT_NAME)
        level_name = os.environ.get(LOGGING_LEVEL_ENV, "INFO").upper()
        level = logging.getLevelName(level_name)
        root.setLevel(level if isinstance(level, int) else logging.INFO)
        if not root.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(_FORMAT, datefmt=_DATE_FORMAT))
            root.addHandler(handler)
        root.propagate = False
        _configured = True


def init_logger(name: str) -> OmniLogger:
    """Return the logger for module `name` (use `__name__`), with `warning_once` and friends."""
    _configure_root()
    previous = logging.getLoggerClass()
    with _configure_lock:
        logging.setLoggerClass(OmniLogger)
        try:
            logger = logging.getLogger(name if name.startswith(_ROOT_NAME) else f"{_ROOT_NAME}.{name}")
        finally:
            logging.setLoggerClass(previous)
    if not isinstance(logger, OmniLogger):
        # Created earlier by someone else with the stock class: upgrade it in place.
        logger.__class__ = OmniLogger
    return cast(OmniLogger, logger)


def _reset_once_cache() -> None:
    """Forget which *_once messages were emitted (tests)."""
    with _once_lock:
        _once_seen.clear()
