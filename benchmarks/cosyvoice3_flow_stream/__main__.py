# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.cosyvoice3_flow_stream [options]`, from the repository root (options: `cli.py`, `--help`)."""

import sys

from benchmarks import run_home

if __name__ == "__main__":
    sys.exit(run_home("cosyvoice3_flow_stream"))
