# SPDX-License-Identifier: Apache-2.0
"""The entry points through which vLLM and vLLM-Omni load this fork (as vLLM-Ascend plugs into vLLM).

Installing `vllm-omni-token2wav` next to vLLM-Omni 0.30 changes nothing until the engine loads these
functions from our distribution's entry points (`pyproject.toml`):

| group                        | function              | what it does, in every process that loads the group     |
|------------------------------|-----------------------|---------------------------------------------------------|
| `vllm_omni.general_plugins`  | `register`            | our stage classes under upstream's architecture names   |
|                              |                       | (`overrides.py`), our code2wav-alone and stand-in        |
|                              |                       | pipelines (`pipelines.py`), the patches of upstream      |
|                              |                       | objects (`patch/`, register in `patch/register.py`)      |
| `vllm.general_plugins`       | `register`            | the same: vLLM loads this group in its engine-core       |
|                              |                       | processes, where vLLM-Omni's group is not loaded and     |
|                              |                       | where the scheduler patch must live                      |
| `vllm_omni.platform_plugins` | `cpu_platform_plugin` | the CPU platform for omni stages, only when no           |
|                              |                       | accelerator platform applies                             |
|                              |                       | (`cpu_platform/platform.py`)                             |

`register()` is idempotent (safe in every process, any number of times) and does nothing but log
once when vLLM-Omni is not importable (a plain vLLM install that happens to have this package).
`VLLM_OMNI_TOKEN2WAV_OVERRIDES=0` keeps upstream's stage classes (the pipelines and the stand-in
producer are still registered, so the same deploy YAMLs run upstream's classes).

Ordering catch (vLLM-Omni 0.30): `Omni(...)` and `vllm-omni serve` resolve the deploy YAML's
pipeline BEFORE they load general plugins, so a pipeline of ours (`pipeline: step_audio2_code2wav`)
is only found when the plugins were loaded first: `vllm-omni-token2wav serve` does that, and offline
callers call `load_plugins()` before building `Omni`. Upstream's own pipelines need no such step:
our classes are registered before any stage model is resolved.
"""

from __future__ import annotations

import threading

from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

__all__ = ["cpu_platform_plugin", "load_plugins", "register"]

# Process-wide: registration touches process-global registries; the lock makes concurrent first
# calls (engine threads) register once.
_lock = threading.Lock()
_registered = False


def register() -> None:
    """Entry point of `vllm_omni.general_plugins` and `vllm.general_plugins` (see the module docstring).

    The first call in a process installs everything; later calls only put our classes back in the
    registries. That matters: vLLM loads every `vllm.general_plugins` function before calling any, so
    upstream's `register_omni_models_to_vllm` (also in that group) may run after ours with the unwrapped
    function and overwrite vLLM's registry entries; vLLM-Omni then calls its group (us again) last.
    """
    global _registered
    with _lock:
        try:
            import vllm_omni  # noqa: F401
        except ImportError:
            if not _registered:
                logger.info("vLLM-Omni is not installed: nothing to register")
            _registered = True
            return
        from vllm_omni_token2wav.plugins.overrides import apply_overrides

        apply_overrides()
        if _registered:
            return
        _registered = True
        from vllm_omni_token2wav.patch import apply_engine_patches
        from vllm_omni_token2wav.plugins.pipelines import register_pipelines

        register_pipelines()
        apply_engine_patches()


def load_plugins() -> None:
    """Load vLLM-Omni's general plugins (ours among them) now; offline callers do this before `Omni(...)`."""
    from vllm_omni.plugins import load_omni_general_plugins

    load_omni_general_plugins()
    register()  # in case plugins were loaded earlier in this process without our entry points


def cpu_platform_plugin() -> str | None:
    """Entry point of `vllm_omni.platform_plugins`: our CPU platform's class path, or None."""
    from vllm_omni_token2wav.plugins.cpu_platform.platform import cpu_platform_plugin as detect

    return detect()
