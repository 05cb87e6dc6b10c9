#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Record one `vllm-omni-token2wav bench token2wav` run under `benchmarks/results/`.

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
    from vllm_omni_token2wav.benchmarks.common import record_main

    stem = "token2wav_rtf"
    return record_main(argv, script=Path(__file__).name, bench="token2wav", stem=stem, results=RESULTS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
