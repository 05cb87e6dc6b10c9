# SPDX-License-Identifier: Apache-2.0
"""CUDA platform package: the platform object and CUDA-only patches (installed explicitly, never at import)."""
