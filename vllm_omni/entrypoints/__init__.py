# SPDX-License-Identifier: Apache-2.0
"""Entry points (the `vllm-omni` command line)."""
