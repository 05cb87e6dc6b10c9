#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Record one `vllm-omni bench token2wav-serve` run under `benchmarks/results/`.

Why: the recorded concurrency table (quoted by docs/benchmarks/token2wav_serve.md, README and the
issue's closing note) must come from the same command an operator runs; this script runs exactly
that command and stores its three outputs as
`benchmarks/results/token2wav_serve[_full]_<device>.{txt,json,png}` (`<device>` = cpu, cuda, npu; `_full` with
`--full`).

    .venv/bin/python benchmarks/token2wav_serve.py                 # reduced stand-in, c = 1, 4, 8 on CPU
    .venv/bin/python benchmarks/token2wav_serve.py --full          # full-size stand-in
    .venv/bin/python benchmarks/token2wav_serve.py --device cuda   # c = 1, 8, 32 on an accelerator

Extra options are passed to the command unchanged (`--json` / `--plot` are set here);
`--results-dir DIR` records somewhere else (tests). The exit code is the command's.
"""

from __future__ import annotations

import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str]) -> int:
    from vllm_omni.benchmarks.common import record_main

    stem = "token2wav_serve_full" if "--full" in argv else "token2wav_serve"
    return record_main(argv, script=Path(__file__).name, bench="token2wav-serve", stem=stem, results=RESULTS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
