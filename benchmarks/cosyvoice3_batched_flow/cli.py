# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.cosyvoice3_batched_flow`: what does one flow launch for B streams save over B calls?

Runs `benchmarks.cosyvoice3_batched_flow.run` on the seeded CosyVoice3 stand-in flow
(reduced unless `--full`), on the CPU, and prints one line per stream count; `--json` keeps the document
(`benchmarks/results/cosyvoice3_batched_flow_cpu[_full].json` holds the recorded ones).

    python -m benchmarks.cosyvoice3_batched_flow --chunks 5                      # reduced, B = 1, 2, 4, 8
    python -m benchmarks.cosyvoice3_batched_flow --full --rows 1 4 --chunks 3 --n-timesteps 1
    python -m benchmarks.cosyvoice3_batched_flow --whole --rows 1 2 4 --chunks 5 --hop 100   # whole utterances

Exit codes: 0 done; 2 usage error. This module only parses options; torch is imported inside `run`.
"""

from __future__ import annotations

import argparse

from vllm_omni_token2wav.atomic_io import write_bytes_atomic
from vllm_omni_token2wav.benchmarks import bench_cli


class BatchedFlowSubcommand:
    name = "cosyvoice3-batched-flow"
    help = "CosyVoice3 flow: B streams' chunks in one launch vs B solo calls (CPU time, row agreement)"

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--full", action="store_true", help="full-size stand-in (default reduced)")
        parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8], metavar="B", help="stream counts")
        parser.add_argument("--chunks", type=int, default=6, help="chunks per stream (the first, upstream's, excluded)")
        parser.add_argument("--hop", type=int, default=25, help="speech tokens per chunk after the first hop")
        parser.add_argument("--n-timesteps", type=int, default=10, help="flow-matching Euler steps")
        parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
        parser.add_argument(
            "--whole",
            action="store_true",
            help="whole utterances (sync path): B of --hop + 13 i tokens in one launch vs B calls; --chunks repeats",
        )
        bench_cli.add_json_option(parser, None)

    def run(self, args: argparse.Namespace) -> int:
        for option in ("chunks", "hop", "n_timesteps", "threads"):
            bench_cli.check_at_least("--" + option.replace("_", "-"), getattr(args, option), 1)
        for rows in args.rows:
            bench_cli.check_at_least("--rows", rows, 1)
        bench_cli.check_output_files(args, ("json",))
        import json

        from benchmarks.cosyvoice3_batched_flow.run import BatchedFlowConfig, render_lines, run

        config = BatchedFlowConfig(
            full=args.full,
            rows=tuple(args.rows),
            chunks=args.chunks,
            hop=args.hop,
            n_timesteps=args.n_timesteps,
            threads=args.threads,
            whole=args.whole,
        )
        result = run(config)
        print("\n".join(render_lines(result)))
        if args.json is not None:
            write_bytes_atomic(args.json, (json.dumps(result, indent=1) + "\n").encode())
        return 0


SUBCOMMAND = BatchedFlowSubcommand()
