# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.prompt_path`: what does `prepare_prompt` cost per prompt length and speaker path?

Runs `benchmarks.prompt_path.run` (ORT CPU fallback, the device path, the torch CAM++,
a warm cache, the lookup alone; interleaved medians) and prints a table; writes `out/prompt_path.json`
unless `--json` says elsewhere (the recorded `benchmarks/results/prompt_path.json` came from `--json` there).

    python -m benchmarks.prompt_path --repeats 20
    python -m benchmarks.prompt_path --model-dir /path/to/token2wav --seconds 3 6 10

This module only parses options; torch and the models are imported inside `run`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_omni_token2wav.benchmarks import bench_cli


class PromptPathSubcommand:
    name = "prompt-path"
    help = "prepare_prompt end to end per prompt length: ORT CPU, device, torch CAM++, cache hit, lookup"

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--model-dir", type=Path, default=None, help="token2wav directory (default: stand-in)")
        parser.add_argument("--seconds", type=float, nargs="+", default=[3.0, 6.0, 10.0], help="prompt lengths")
        parser.add_argument("--repeats", type=int, default=20, help="timed calls per case (>= 20)")
        bench_cli.add_json_option(parser, bench_cli.DEFAULT_REPORT_DIR / "prompt_path.json", deprecated=("--out",))

    def run(self, args: argparse.Namespace) -> int:
        from benchmarks.prompt_path.run import execute

        return execute(args)


SUBCOMMAND = PromptPathSubcommand()
