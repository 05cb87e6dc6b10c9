#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The one command a session holding an accelerator runs as is: `python3 benchmarks/device_check.py`.

Why: accelerators are lent rarely (one prepared command, <= 10 min per call, 15 min of device time in
all, only files under `$OUT` come back) and nothing is installed there; this script runs
`vllm-omni-token2wav bench device-check` from the repository checkout without installing the package (it puts
the checkout on `sys.path`), writes `device_check.json` / `.txt` / `.png` into `$OUT` when set (else
`./out`), and finishes within its 7-minute deadline on one H200 or an Ascend NPU. Options are passed
through (`--smoke`, `--device`, `--sections`, `--deadline-s`, `--onnx`, `--model-dir`, `--out-dir`).

The device tool call (docs/design/device_graphs.md explains the sizing):

    run(command="set -o pipefail; PYTHONUNBUFFERED=1 python3 benchmarks/device_check.py 2>&1 "
                "| tee $OUT/device_check.log",
        timeout_s=540)

CPU smoke (CI runs it through tests/benchmarks/device_check/test_device_check.py):

    python benchmarks/device_check.py --device cpu --smoke --out-dir out/device_check_smoke

Record a device run by copying its JSON and table to `benchmarks/results/device_check_<device>.{json,txt}`.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from vllm_omni_token2wav.entrypoints.cli.main import main as cli_main

    return cli_main(["bench", "device-check", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
