# SPDX-License-Identifier: Apache-2.0
"""Single source of the package version (read by pyproject.toml and `vllm-omni-token2wav --version`)."""

__version__ = "0.1.0"
