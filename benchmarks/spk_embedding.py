#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Record one `vllm-omni-token2wav bench spk-embedding` run under `benchmarks/results/`.

Why: the recorded CAM++ parity and latency report (quoted by the README) must come from the same
command an operator runs; this script runs exactly that command and stores its three outputs as
`benchmarks/results/spk_embedding_<device>.{txt,json,png}` (`<device>` = cpu, cuda, npu).

    .venv/bin/python benchmarks/spk_embedding.py                 # the embedded default
    .venv/bin/python benchmarks/spk_embedding.py --onnx /path/to/campplus.onnx --threads 1

Extra options are passed to the command unchanged (`--json` / `--plot` are set here). The exit
code is the command's.
"""

from __future__ import annotations

import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str]) -> int:
    from vllm_omni_token2wav.benchmarks.common import argv_device_type, record_cli_run

    stem = RESULTS / f"spk_embedding_{argv_device_type(argv)}"
    # Exit code 1 (a parity mismatch) is a result worth keeping, not a failed run.
    return record_cli_run(["bench", "spk-embedding", *argv], stem, recorded_codes=(0, 1))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
