# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.code2wav_replicas [options]`, from the repository root (options: `cli.py`, `--help`)."""

import sys

from benchmarks import run_home

if __name__ == "__main__":
    sys.exit(run_home("code2wav_replicas"))
