#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Record one `vllm-omni-token2wav bench token2wav --family cosyvoice3` run under `benchmarks/results/`.

Why: the recorded CosyVoice3 numbers (RTF, first audio, cost per chunk vs chunk index; quoted by
docs/benchmarks/token2wav_cosyvoice3.md and the issue's closing note) must come from the same command
an operator runs; this script runs exactly that command and stores its three outputs as
`benchmarks/results/token2wav_cosyvoice3[_full]_<device>.{txt,json,png}` (`<device>` = cpu, cuda,
npu; `_full` with `--full`).

    .venv/bin/python benchmarks/token2wav_cosyvoice3.py                  # reduced stand-in, 50 chunks
    .venv/bin/python benchmarks/token2wav_cosyvoice3.py --full           # full size (CPU: 1 step, 20 chunks)
    .venv/bin/python benchmarks/token2wav_cosyvoice3.py --full --device cuda

Extra options are passed to the command unchanged (`--json` / `--plot` are set here);
`--results-dir DIR` records somewhere else (tests). The exit code is the command's.
"""

from __future__ import annotations

import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str]) -> int:
    from vllm_omni_token2wav.benchmarks.common import record_main

    stem = "token2wav_cosyvoice3_full" if "--full" in argv else "token2wav_cosyvoice3"
    return record_main(
        ["--family", "cosyvoice3", *argv], script=Path(__file__).name, bench="token2wav", stem=stem, results=RESULTS
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
