# SPDX-License-Identifier: Apache-2.0
"""Every patch this plugin applies to an upstream object, one module each, applied by the plugin, never on import.

The register (`register.py:PATCHES`, rendered in docs/design/patches.md) names for each patch the patched
upstream object, why, how, the upstream issue or why there is none, when to remove it and the vLLM /
vLLM-Omni version it was written against. Grouped by where they act, after vLLM-Ascend's `patch/`:

| folder      | patch module                          | patched upstream object                                      |
|-------------|---------------------------------------|--------------------------------------------------------------|
| `platform/` | `patch_omni_model_registration.py`    | `vllm_omni.engine.arg_utils.register_omni_models_to_vllm`    |
| `worker/`   | `patch_generation_scheduler.py`       | `OmniGenerationScheduler.update_from_output` (engine core)   |
| `worker/`   | `patch_latency_planning.py`           | `OmniGenerationScheduler.schedule` (engine core)             |
| `worker/`   | `patch_cuda_graph_wrapper.py`         | vLLM's `CUDAGraphWrapper.__call__` (CUDA workers)            |
| `worker/`   | `patch_acl_graph_wrapper.py`          | vLLM-Ascend's `ACLGraphWrapper.__call__` (NPU workers)       |
| `worker/`   | `patch_async_chunk_sender.py`         | `omni_connector_runtime._should_create_payload_connector`    |
| `worker/`   | `patch_mooncake_connectors.py`        | the Mooncake connectors' `__init__` (`stage_id`, host pool)  |

Helpers, not patches: `checks.py` (the install-time checks: a patch whose upstream symbol is missing or has
another shape raises `checks.UpstreamMismatchError` naming it and the installed versions, instead of degrading
silently), `graph_guard_installer.py` (shared by the two graph-wrapper patches), `mooncake_libs.py` (loads the
system libraries Mooncake links from a folder, for hosts without root).

Who installs what: `plugins.register()` (vLLM and vLLM-Omni call it in every process they start, worker
processes included, before a model runner captures graphs) calls `plugins.overrides.apply_overrides()`,
which installs the registration patch with the plugin's own re-registration, and `apply_engine_patches()`
below, which installs the `worker/` patches that apply to this host. Each install is idempotent and has an
`uninstall()` for tests.
"""

from __future__ import annotations

from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

__all__ = ["apply_engine_patches"]


def apply_engine_patches() -> None:
    """Install every `worker/` patch that applies to this process (the register's rows; see the docstring)."""
    from vllm_omni_token2wav.patch.worker import patch_generation_scheduler, patch_latency_planning

    patch_generation_scheduler.install()
    patch_latency_planning.install()
    _install_mooncake_patches()
    _install_acl_graph_guard()
    _install_cuda_graph_guard()


def _install_mooncake_patches() -> None:
    """The two Mooncake edge fixes, where their version gate holds (vLLM-Omni 0.30.x with `mooncake` installed)."""
    from vllm_omni_token2wav.patch.worker import patch_async_chunk_sender, patch_mooncake_connectors

    if not patch_mooncake_connectors.applies():
        return
    patch_mooncake_connectors.install()
    patch_async_chunk_sender.install()
    logger.info_once("installed the Mooncake connector patches (vLLM-Omni 0.30, mooncake present)")


def _install_acl_graph_guard() -> None:
    try:
        import vllm_ascend.compilation.acl_graph  # noqa: F401
    except Exception:  # no vLLM-Ascend here (or no CANN): nothing to guard
        return
    from vllm_omni_token2wav.patch.worker import patch_acl_graph_wrapper

    patch_acl_graph_wrapper.install()
    logger.info_once("installed the ACLGraphWrapper capture guard (vLLM-Ascend present)")


def _install_cuda_graph_guard() -> None:
    """Guard vLLM's `CUDAGraphWrapper` where this process serves on CUDA (the platform object decides)."""
    from vllm_omni_token2wav import platforms

    try:
        on_cuda = platforms.current_omni_platform.is_cuda()
    except Exception as exc:  # e.g. VLLM_OMNI_TOKEN2WAV_PLATFORM=cuda without a device: the stage reports it
        logger.debug("no CUDA capture guard: platform detection failed (%s)", exc)
        return
    if not on_cuda:
        return
    try:
        import vllm.compilation.cuda_graph  # noqa: F401
    except Exception as exc:  # a vLLM without CUDA graph support: nothing to guard
        logger.debug("no CUDA capture guard: vllm.compilation.cuda_graph does not import (%s)", exc)
        return
    from vllm_omni_token2wav.patch.worker import patch_cuda_graph_wrapper

    patch_cuda_graph_wrapper.install()
    logger.info_once("installed the CUDAGraphWrapper capture guard (CUDA platform)")
