#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Record one `vllm-omni bench token2wav` run under `benchmarks/results/`.

Why: the recorded Token2Wav RTF table (quoted by docs/benchmarks/token2wav.md and the issue's closing
note) must come from the same command an operator runs; this script runs exactly that command and
stores its three outputs as `benchmarks/results/token2wav_rtf_<device>.{txt,json,png}` (`<device>` =
cpu, cuda, npu).

    .venv/bin/python benchmarks/token2wav_rtf.py                     # full-size stand-in, device defaults
    .venv/bin/python benchmarks/token2wav_rtf.py --model-dir /path/to/token2wav --threads 1

Extra options are passed to the command unchanged (`--json` / `--plot` are set here);
`--results-dir DIR` records somewhere else (tests). The exit code is the command's.
"""

from __future__ import annotations

import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str]) -> int:
    from vllm_omni.benchmarks.common import argv_device_type, pop_results_dir, record_cli_run
    from vllm_omni.entrypoints.cli.types import CLIUsageError

    try:
        results, argv = pop_results_dir(argv, RESULTS)
    except CLIUsageError as exc:
        print(f"token2wav_rtf.py: {exc}", file=sys.stderr)
        return 2
    stem = results / f"token2wav_rtf_{argv_device_type(argv)}"
    return record_cli_run(["bench", "token2wav", *argv], stem, recorded_codes=(0,))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
