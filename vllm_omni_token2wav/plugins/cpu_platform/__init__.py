# SPDX-License-Identifier: Apache-2.0
"""vLLM-Omni's engine platform for CPU-only hosts (`platform.py`), its workers (`worker/`), its diffusion attention.

It lives beside the plugin, not in `platforms/` (our device-facing layer): every module here imports vLLM and
vLLM-Omni at module top, and only the `vllm_omni.platform_plugins` entry point (`plugins.cpu_platform_plugin`)
and vLLM-Omni's worker resolution (by class path) load it. This `__init__` imports nothing.
"""
