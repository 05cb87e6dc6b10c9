#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Record one `vllm-omni-token2wav bench cosyvoice3-flow` run under `benchmarks/results/`.

Why: the recorded cost-per-chunk curve (quoted by docs/benchmarks/cosyvoice3_flow.md and the issue's
closing note) must come from the same command an operator runs; this script runs exactly that
command and stores its outputs as `benchmarks/results/cosyvoice3_flow_stream_<device>[_<tag>].{txt,json,png}`.

    .venv/bin/python benchmarks/cosyvoice3_flow_stream.py                       # reduced stand-in, 50 chunks
    .venv/bin/python benchmarks/cosyvoice3_flow_stream.py --tag full --full --chunks 12 --n-timesteps 1

Extra options are passed to the command unchanged (`--json` / `--plot` are set here);
`--results-dir DIR` records somewhere else (tests). The exit code is the command's.
"""

from __future__ import annotations

import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _pop_option(argv: list[str], name: str) -> tuple[list[str], str | None]:
    if name not in argv:
        return argv, None
    i = argv.index(name)
    if i + 1 >= len(argv):
        raise SystemExit(f"cosyvoice3_flow_stream.py: {name} needs a value")
    return argv[:i] + argv[i + 2 :], argv[i + 1]


def main(argv: list[str]) -> int:
    from vllm_omni_token2wav.benchmarks.common import argv_device_type, record_cli_run

    argv, results_dir = _pop_option(argv, "--results-dir")
    argv, tag = _pop_option(argv, "--tag")
    results = Path(results_dir) if results_dir else RESULTS
    stem = results / f"cosyvoice3_flow_stream_{argv_device_type(argv)}{'_' + tag if tag else ''}"
    return record_cli_run(["bench", "cosyvoice3-flow", *argv], stem, recorded_codes=(0,))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
