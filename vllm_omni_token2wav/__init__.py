# SPDX-License-Identifier: Apache-2.0
"""vLLM-Omni fork focused on the Token2Wav (code2wav) audio output stage.

Importing this package is cheap and side-effect free: it never imports torch_npu, vllm or
vllm_ascend, and it never patches anything. Platform detection and platform patches happen
lazily, on first use of `vllm_omni_token2wav.platforms.current_omni_platform` or an explicit `install_*()`.
"""

from vllm_omni_token2wav.version import __version__

__all__ = ["__version__"]
