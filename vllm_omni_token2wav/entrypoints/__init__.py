# SPDX-License-Identifier: Apache-2.0
"""Entry points (the `vllm-omni-token2wav` command line)."""
