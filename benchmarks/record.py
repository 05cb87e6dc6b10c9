#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Record one run of a `vllm-omni-token2wav bench` subcommand under `benchmarks/results/`.

Why: a recorded number (quoted by docs/benchmarks/*.md, the README and design notes) must come from the
same command an operator runs; this script runs exactly that command in-process and keeps its table,
JSON and PNG side by side as `benchmarks/results/<stem>_<device>.{txt,json,png}`. Each benchmark home
declares its recorder (name, command, how options name the variant) in its `cli.py`: the package's
(`vllm_omni_token2wav/benchmarks/<name>/`, `bench ...`) and the developer homes beside this file
(`benchmarks/<name>/`, `python -m benchmarks.<name>`); this file only hands over to
`vllm_omni_token2wav/entrypoints/cli/record.py` from the checkout it sits in.

    python benchmarks/record.py --list                                # names, commands, file names
    python benchmarks/record.py token2wav_rtf --threads 1             # = bench token2wav --threads 1
    python benchmarks/record.py causal_hift_stream --full             # = python -m benchmarks.causal_hift_stream --full
    python benchmarks/record.py token2wav_serve --engine              # = bench token2wav-serve --engine
    python benchmarks/record.py cosyvoice3_flow_stream --tag full --full --chunks 20

Options after NAME go to the command unchanged (`--json` / `--plot` are set here); `--results-dir DIR`
records somewhere else (tests). The exit code is the command's (2 for an unknown NAME).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def main(argv: list[str]) -> int:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from benchmarks import all_recorders
    from vllm_omni_token2wav.entrypoints.cli.record import record_main

    return record_main(argv, RESULTS, all_recorders())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
