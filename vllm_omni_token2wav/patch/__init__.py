# SPDX-License-Identifier: Apache-2.0
"""Patches of the engine that our stages need, applied by the plugin (`plugins.register`), never on import.

| patch                                   | patched object                         | why                       |
|-----------------------------------------|----------------------------------------|---------------------------|
| `request_errors.install_request_errors` | vLLM-Omni's `OmniGenerationScheduler`  | a request our stage       |
|                                         | `.update_from_output`                  | cannot serve fails alone, |
|                                         |                                        | with its message, instead |
|                                         |                                        | of the engine core dying  |
| ACL graph capture guard                 | vLLM-Ascend's `ACLGraphWrapper`        | piecewise decode graphs   |
| (`platforms/npu/attention/`)            | `.__call__` (where vLLM-Ascend         | are captured and replayed,|
|                                         | imports)                               | not silently run eager    |
| CUDA graph capture guard                | vLLM's `CUDAGraphWrapper.__call__`     | the same on CUDA: a step  |
| (`platforms/cuda/cuda_graph_guard.py`)  | (where this process serves on CUDA:    | that would capture after  |
|                                         | `current_omni_platform.is_cuda()`)     | the window runs eager,    |
|                                         |                                        | counted, not fatal        |

Each install is idempotent and has an uninstall for tests. They run from `plugins.register()`, which
vLLM and vLLM-Omni call in every engine process (worker processes included) before a model runner
captures graphs, so the guards are in place for the capture window.
"""

from __future__ import annotations

from vllm_omni_token2wav.logger import init_logger

logger = init_logger(__name__)

__all__ = ["apply_engine_patches"]


def apply_engine_patches() -> None:
    """Install every patch of the table that applies to this process's engine."""
    from vllm_omni_token2wav.patch.request_errors import install_request_errors

    install_request_errors()
    _install_ascend_capture_guard()
    _install_cuda_capture_guard()


def _install_ascend_capture_guard() -> None:
    try:
        import vllm_ascend.compilation.acl_graph  # noqa: F401
    except Exception:  # no vLLM-Ascend here (or no CANN): nothing to guard
        return
    from vllm_omni_token2wav.platforms.npu.attention.static_shape_decode import install_into_ascend_aclgraph

    install_into_ascend_aclgraph()
    logger.info_once("installed the ACLGraphWrapper capture guard (vLLM-Ascend present)")


def _install_cuda_capture_guard() -> None:
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
    from vllm_omni_token2wav.platforms.cuda.cuda_graph_guard import install_into_cuda_graph_wrapper

    install_into_cuda_graph_wrapper()
    logger.info_once("installed the CUDAGraphWrapper capture guard (CUDA platform)")
