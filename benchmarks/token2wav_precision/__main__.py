# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.token2wav_precision [options]`, from the repository root (options: `cli.py`, `--help`)."""

import sys

from benchmarks import run_home

if __name__ == "__main__":
    sys.exit(run_home("token2wav_precision"))
