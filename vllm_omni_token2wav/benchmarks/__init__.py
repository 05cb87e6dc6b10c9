# SPDX-License-Identifier: Apache-2.0
"""Benchmark implementations behind `vllm-omni-token2wav bench ...` (the CLI modules only parse options)."""
