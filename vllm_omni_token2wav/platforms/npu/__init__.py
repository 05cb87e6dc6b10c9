# SPDX-License-Identifier: Apache-2.0
"""Ascend NPU platform package: the platform object and NPU-only patches.

Nothing here imports `torch_npu` or `vllm_ascend` at module import time: they need CANN's native
libraries and are imported inside the functions that use them.
"""
