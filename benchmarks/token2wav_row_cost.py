#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Record one `vllm-omni-token2wav bench token2wav-row-cost` run under `benchmarks/results/`.

Why: the per-row cost profile quoted by docs/benchmarks/token2wav_serve.md and the Limitations of
docs/design/token2wav_stage.md (where a batched row's milliseconds go, and the bound on what
batching can buy) must come from the command an operator runs; this script runs it and keeps
`benchmarks/results/token2wav_row_cost[_full][_<N>threads][_cpuclock]_<device>.{txt,json,png}`.

    .venv/bin/python benchmarks/token2wav_row_cost.py                 # reduced stand-in, 1 thread, CPU
    .venv/bin/python benchmarks/token2wav_row_cost.py --threads 2     # same, 2 threads (a quiet host)
    .venv/bin/python benchmarks/token2wav_row_cost.py --clock cpu     # 1 thread, CPU time (a shared host)
    .venv/bin/python benchmarks/token2wav_row_cost.py --full --rows 1,4 --reps 2

Extra options are passed to the command unchanged (`--json` / `--plot` are set here);
`--results-dir DIR` records somewhere else (tests). The exit code is the command's.
"""

from __future__ import annotations

import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def stem_for(argv: list[str]) -> str:
    """`token2wav_row_cost[_full][_<N>threads][_cpuclock]`: one record per size, thread count and clock."""
    from vllm_omni_token2wav.benchmarks.common import thread_clock_suffix

    stem = "token2wav_row_cost_full" if "--full" in argv else "token2wav_row_cost"
    return stem + thread_clock_suffix(argv)


def main(argv: list[str]) -> int:
    from vllm_omni_token2wav.benchmarks.common import record_main

    return record_main(
        argv, script=Path(__file__).name, bench="token2wav-row-cost", stem=stem_for(argv), results=RESULTS
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
