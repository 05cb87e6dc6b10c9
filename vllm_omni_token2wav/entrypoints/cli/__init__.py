# SPDX-License-Identifier: Apache-2.0
"""The `vllm-omni-token2wav` command line: `main.py` builds the parser, `bench/` holds the benchmark subcommands."""
