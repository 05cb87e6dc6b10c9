# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.upstream_audio [options]`, from the repository root (options: `cli.py`, `--help`)."""

import sys

from benchmarks import run_home

if __name__ == "__main__":
    sys.exit(run_home("upstream_audio"))
