# SPDX-License-Identifier: Apache-2.0
"""A `vllm-omni-token2wav serve` process on loopback, for the engine tests and `--engine` benchmarks.

Starting the real engine takes 1-2 minutes on a 2-core CPU (one engine-core process and one worker
per stage), so callers start one server per deployment and reuse it. `EngineServer` runs the
console script in its own process group on a free 127.0.0.1 port, writes everything it prints to a
log file (the path is in every error), waits until `/health` answers, and on `stop()` terminates the
whole group (engine cores and workers included), escalating to SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["EngineServer", "EngineServerError", "free_port"]


class EngineServerError(RuntimeError):
    """The server did not come up (or died); the message names its log file and its last lines."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a server's log (for failure messages)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_process_group(proc: subprocess.Popen[bytes], sig: int, grace_s: float) -> None:
    """Stop `proc` and its process group (it was started with `start_new_session`): `sig` to the group while the
    leader runs, SIGKILL after `grace_s`; then whatever of the group outlived its leader gets 5 s, then SIGKILL."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=grace_s)
        except ProcessLookupError:
            pass
    # Engine cores and workers can outlive the API server that led the group (a crash, a slow exit):
    # a few seconds to finish their own shutdown, then SIGKILL.
    deadline = time.monotonic() + 5.0
    with contextlib.suppress(ProcessLookupError, PermissionError):
        while time.monotonic() < deadline:
            os.killpg(proc.pid, 0)  # raises ProcessLookupError once no process of the group is left
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)


@dataclass
class EngineServer:
    """`vllm-omni-token2wav serve <model> --deploy-config <deploy> <extra_args>` on 127.0.0.1."""

    model: Path
    deploy: Path
    log_path: Path
    extra_args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    port: int = 0
    startup_timeout_s: float = 600.0
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> EngineServer:
        """Launch the server and wait until it answers `/health` (`launch()` then `wait_ready()`)."""
        self.launch()
        self.wait_ready()
        return self

    def launch(self) -> EngineServer:
        """Start the process and return at once: several servers can then start side by side (`wait_ready()`)."""
        if self._proc is not None:
            raise EngineServerError("EngineServer.launch() called twice")
        self.port = self.port or free_port()
        command = [
            sys.executable,
            "-m",
            "vllm_omni_token2wav",
            "serve",
            str(self.model),
            "--deploy-config",
            str(self.deploy),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.extra_args,
        ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        try:
            self._proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,  # its own process group: stop() reaches engine cores and workers
            )
        finally:
            log.close()
        return self

    def wait_ready(self) -> None:
        """Return once `/health` answers; raise `EngineServerError` (the server stopped) if it exits or times out."""
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                code = self._proc.returncode
                self.stop()  # what of its group outlived it (engine cores, workers)
                raise EngineServerError(
                    f"the server exited with code {code} before it was ready; log {self.log_path}:\n"
                    + log_tail(self.log_path)
                )
            if self.healthy():
                return
            time.sleep(1.0)
        self.stop()
        raise EngineServerError(
            f"the server was not ready after {self.startup_timeout_s:.0f} s; log {self.log_path}:\n"
            + log_tail(self.log_path)
        )

    def healthy(self) -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2.0)
            conn.request("GET", "/health")
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        except OSError:
            return False

    @property
    def pid(self) -> int | None:
        """The server process's id (its group's leader: engine cores and workers are its descendants), or None."""
        return None if self._proc is None else self._proc.pid

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGINT to the process group, SIGKILL after `grace_s`; then SIGKILL to whatever of the group remains."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process_group(proc, signal.SIGINT, grace_s)

    def __enter__(self) -> EngineServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
