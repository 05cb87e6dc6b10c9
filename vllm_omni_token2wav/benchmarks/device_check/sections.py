# SPDX-License-Identifier: Apache-2.0
"""The device check's section API: what a section gets (`SectionContext`), what it is (`Section`), how it stops.

A section module (`machine`, `campplus`, `stage`, `token2wav`) imports this module and nothing from the
runner (`run.py`), which imports the section modules to list them in `default_sections`: the API lives
here so that the dependency runs one way, runner -> sections -> this module.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from vllm_omni_token2wav.atomic_io import write_bytes_atomic
from vllm_omni_token2wav.benchmarks.common import finite

if TYPE_CHECKING:
    import torch

#: The issue's limit for one H200 run (7 min); the device tool's call limit is 10 min.
DEFAULT_DEADLINE_S: Final = 420.0
SMOKE_DEADLINE_S: Final = 360.0  # a CPU smoke beside other work (CI runs it next to the engine tests)


class SectionTimeout(BaseException):
    """Raised by the hard timer inside a section that ran past its budget (BaseException: no `except
    Exception` in measured code swallows it, like KeyboardInterrupt)."""


class SectionSkip(Exception):  # noqa: N818 - a control-flow signal, not an error
    """A section cannot run here (missing extra, missing product of an earlier section); the message says why."""


@dataclass(frozen=True)
class CheckConfig:
    """What one device check runs. `deadline_s` None: 7 min, or `SMOKE_DEADLINE_S` with `smoke`."""

    device: str = "auto"
    smoke: bool = False
    out_dir: Path = Path("out")
    deadline_s: float | None = None
    sections: tuple[str, ...] = ()  # empty: all, in the default order
    onnx: Path | None = None  # a real campplus.onnx instead of the stand-in
    model_dir: Path | None = None  # a real token2wav directory instead of the stand-in
    threads: int = 1  # torch host threads (CPU kernels, launch thread); onnxruntime always uses 1
    seed: int = 0

    @property
    def resolved_deadline_s(self) -> float:
        if self.deadline_s is not None:
            return self.deadline_s
        return SMOKE_DEADLINE_S if self.smoke else DEFAULT_DEADLINE_S


class DeviceCheckReport:
    """The JSON document, rewritten atomically on every `write()` (thread-safe: the watchdog writes too)."""

    def __init__(self, path: Path, document: dict[str, Any]) -> None:
        self.path = path
        self.document = document
        self._lock = threading.Lock()

    def write(self) -> None:
        with self._lock:
            for attempt in range(3):  # the main thread may mutate a dict while the watchdog serialises
                try:
                    # `default=repr`: a value JSON cannot hold is written as its repr, never a failed write
                    text = json.dumps(finite(self.document), indent=2, allow_nan=False, default=repr) + "\n"
                    break
                except RuntimeError:
                    if attempt == 2:
                        raise
                    time.sleep(0.05)
            write_bytes_atomic(self.path, text.encode())

    def section(self, name: str) -> dict[str, Any]:
        return self.document["sections"][name]  # type: ignore[no-any-return]


class SectionContext:
    """What a section's `run(ctx)` gets: the device, its deadline, its result dict and shared products."""

    def __init__(
        self,
        *,
        config: CheckConfig,
        device: torch.device,
        report: DeviceCheckReport,
        name: str,
        deadline: float,
        shared: dict[str, Any],
        graph_api: Any,
        log: Callable[[str], None],
    ) -> None:
        from vllm_omni_token2wav import platforms

        self.config = config
        self.device = device
        self.platform = platforms.current_omni_platform
        self.name = name
        self.deadline = deadline
        self.shared = shared
        self.graph_api = graph_api
        self._report = report
        self._log = log
        self.partial = False
        self.entry = report.section(name)
        self.result: dict[str, Any] = self.entry["result"]

    @property
    def smoke(self) -> bool:
        return self.config.smoke

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def out_of_time(self, reserve_s: float = 0.0) -> bool:
        """True (and the section is marked partial) when less than `reserve_s` of its budget is left."""
        if self.time_left() <= reserve_s:
            self.partial = True
            return True
        return False

    def sync(self) -> None:
        """Wait for the device's queued work (no-op on CPU)."""
        if self.device.type != "cpu":
            self.platform.synchronize(self.device)

    def note(self, text: str) -> None:
        self.entry["notes"].append(text)
        self.log(text)

    def log(self, text: str) -> None:
        self._log(f"[{self.name}] {text}")

    def goal(self, name: str, value: float | None, target: str, passed: bool | None, where: str) -> None:
        """Record a goal of the issue measured here (`passed` None: not applicable on this host)."""
        self._report.document["goals"][name] = {
            "value": value,
            "target": target,
            "passed": passed,
            "where": where,
            "section": self.name,
        }

    def flush(self) -> None:
        self._report.write()


@dataclass(frozen=True)
class Section:
    """One pluggable part of the check. `render(result)` gives its table lines (optional)."""

    name: str
    title: str
    budget_s: float
    smoke_budget_s: float
    run: Callable[[SectionContext], None]
    render: Callable[[dict[str, Any]], list[str]] | None = None

    def budget(self, smoke: bool) -> float:
        return self.smoke_budget_s if smoke else self.budget_s


__all__ = [
    "DEFAULT_DEADLINE_S",
    "SMOKE_DEADLINE_S",
    "CheckConfig",
    "DeviceCheckReport",
    "Section",
    "SectionContext",
    "SectionSkip",
    "SectionTimeout",
]
