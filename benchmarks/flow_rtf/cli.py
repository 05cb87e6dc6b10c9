# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.flow_rtf`: what does the in-tree flow model cost on this device, whole and streaming?

Runs `benchmarks.flow_rtf.run` (conformer encoder + DiT + CFM at the real or the
reduced geometry, seeded weights) and prints a table; writes `out/flow_rtf.json` unless `--json` says
elsewhere (the recorded `benchmarks/results/flow_rtf.json` came from `--json` there).

    python -m benchmarks.flow_rtf --threads 1
    python -m benchmarks.flow_rtf --gen-seconds 10 --prompt-seconds 3 --runs 5     # accelerator

This module only parses options; torch and the models are imported inside `run`.
"""

from __future__ import annotations

import argparse

from vllm_omni_token2wav.benchmarks import bench_cli


class FlowRtfSubcommand:
    name = "flow-rtf"
    help = "CosyVoice2 flow model speed at full size: mel frames/s and RTF, whole and streaming"

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--device", default=None, help="torch device (default: the platform's serving device)")
        parser.add_argument("--config", choices=("real", "reduced"), default="real")
        parser.add_argument("--gen-seconds", type=float, default=None, help="generated audio (default 10, CPU 2)")
        parser.add_argument("--prompt-seconds", type=float, default=None, help="prompt audio (default 3, CPU 1)")
        parser.add_argument("--timesteps", type=int, nargs="+", default=[10, 5])
        parser.add_argument(
            "--dtypes", nargs="+", choices=("fp32", "fp16"), default=None, help="default fp32 (+fp16 off CPU)"
        )
        parser.add_argument("--modes", nargs="+", choices=("whole", "stream"), default=["whole", "stream"])
        parser.add_argument("--runs", type=int, default=5)
        parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
        bench_cli.add_json_option(parser, bench_cli.DEFAULT_REPORT_DIR / "flow_rtf.json", deprecated=("--output",))

    def run(self, args: argparse.Namespace) -> int:
        from benchmarks.flow_rtf.run import execute

        return execute(args)


SUBCOMMAND = FlowRtfSubcommand()
