# SPDX-License-Identifier: Apache-2.0
"""One `vllm-omni-token2wav serve` process of a split deployment, in its own process group, folder and environment.

A split deployment is several `serve` processes (the head, headless stage nodes) that must start, die and be
cleaned up independently, as on separate hosts: each gets `start_new_session` (its engine cores and workers join
its process group, so one `killpg` takes the whole node down), its own working folder, environment and log. Used
by the split-deployment engine test (`tests/entrypoints/cli/test_serve_split_node.py`) and the manual check of
upstream's pipelines split (`tools/check_split_pipelines.py`).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from vllm_omni_token2wav.benchmarks.engine_server import log_tail, stop_process_group


@dataclass
class ServeProcess:
    """`python -m vllm_omni_token2wav serve <args>` started in `cwd` with `env`, stdout and stderr to `log`."""

    args: list[str]
    cwd: Path
    env: dict[str, str]
    log: Path
    name: str = "serve"
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.cwd.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "vllm_omni_token2wav", "serve", *self.args],
                cwd=self.cwd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self, sig: int = signal.SIGTERM, wait_s: float = 30.0) -> None:
        """`sig` to the whole group, SIGKILL after `wait_s`, then SIGKILL to what is left of the group (engine cores
        and workers outlive their leader; the head hangs after stopping its stages on SIGTERM)."""
        if self.popen is not None:
            stop_process_group(self.popen, sig, wait_s)

    def tail(self, lines: int = 40) -> str:
        """The last `lines` lines of the log (for failure messages)."""
        return log_tail(self.log, lines)


__all__ = ["ServeProcess"]
