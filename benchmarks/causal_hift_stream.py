#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Record one `vllm-omni-token2wav bench causal-hift` run under `benchmarks/results/`.

Why: the recorded cost-per-chunk curve of the causal HiFT (bounded streaming vs upstream's
cumulative re-run; quoted by docs/benchmarks/causal_hift.md and the issue's closing note) must come
from the same command an operator runs; this script runs exactly that command and stores its three
outputs as `benchmarks/results/causal_hift_stream[_full]_<device>.{txt,json,png}` (`<device>` = cpu,
cuda, npu; `_full` with `--full`).

    .venv/bin/python benchmarks/causal_hift_stream.py                       # reduced stand-in, 55 x 50 frames
    .venv/bin/python benchmarks/causal_hift_stream.py --full --device cuda --runs 3

Extra options are passed to the command unchanged (`--json` / `--plot` are set here);
`--results-dir DIR` records somewhere else (tests). The exit code is the command's.
"""

from __future__ import annotations

import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str]) -> int:
    from vllm_omni_token2wav.benchmarks.common import record_main

    stem = "causal_hift_stream_full" if "--full" in argv else "causal_hift_stream"
    return record_main(argv, script=Path(__file__).name, bench="causal-hift", stem=stem, results=RESULTS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
