# SPDX-License-Identifier: Apache-2.0
"""The `vllm-omni` command line: `main.py` builds the parser, `bench/` holds the benchmark subcommands."""
