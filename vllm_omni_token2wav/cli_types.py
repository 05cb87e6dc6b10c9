# SPDX-License-Identifier: Apache-2.0
"""The contract every CLI subcommand module fulfils, and the user-error type the CLI turns into exit 2.

Subcommand modules must stay cheap to import (argparse only): heavy imports (torch models,
onnxruntime sessions, ASR) happen inside `run`, so `vllm-omni-token2wav --help` stays fast.
"""

from __future__ import annotations

import argparse
from typing import Protocol


class CLIUsageError(Exception):
    """A user mistake (bad option value, missing file). Printed as `vllm-omni-token2wav: error: ...`, exit code 2."""


class CLISubcommand(Protocol):
    name: str
    help: str

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        """Declare the subcommand's options on its own parser."""

    def run(self, args: argparse.Namespace) -> int:
        """Execute; return the process exit code."""
