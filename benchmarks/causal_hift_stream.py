#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Record one `vllm-omni bench causal-hift` run under `benchmarks/results/`.

Why: the recorded cost-per-chunk curve of the causal HiFT (bounded streaming vs upstream's
cumulative re-run; quoted by docs/benchmarks/causal_hift.md and the issue's closing note) must come
from the same command an operator runs; this script runs exactly that command and stores its three
outputs as `benchmarks/results/causal_hift_stream_<device>[_full].{txt,json,png}` (`<device>` = cpu,
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
    from vllm_omni.benchmarks.common import argv_device_type, pop_results_dir, record_cli_run
    from vllm_omni.entrypoints.cli.types import CLIUsageError

    try:
        results, argv = pop_results_dir(argv, RESULTS)
    except CLIUsageError as exc:
        print(f"causal_hift_stream.py: {exc}", file=sys.stderr)
        return 2
    size = "_full" if "--full" in argv else ""
    stem = results / f"causal_hift_stream_{argv_device_type(argv)}{size}"
    return record_cli_run(["bench", "causal-hift", *argv], stem, recorded_codes=(0,))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
