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

Each install is idempotent and has an uninstall for tests.
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


def _install_ascend_capture_guard() -> None:
    try:
        import vllm_ascend.compilation.acl_graph  # noqa: F401
    except Exception:  # no vLLM-Ascend here (or no CANN): nothing to guard
        return
    from vllm_omni_token2wav.platforms.npu.attention.static_shape_decode import install_into_ascend_aclgraph

    install_into_ascend_aclgraph()
    logger.info_once("installed the ACLGraphWrapper capture guard (vLLM-Ascend present)")
