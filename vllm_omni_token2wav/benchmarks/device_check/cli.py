# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav bench device-check`: the device path in one bounded run (CAM++, fbank, prompt, Token2Wav).

Runs `vllm_omni_token2wav.benchmarks.device_check.run` (sections, deadline and report format are described there and
in docs/benchmarks/device_check.md). Reports go to `--out-dir`, default `$OUT` when that variable is
set (the device tool returns only files under it), else `./out`: `device_check.json` (rewritten after
every measurement), `device_check.txt` (the printed table) and `device_check.png` (CAM++ latency).

Exit codes: 0 every section ok / partial / skipped; 1 a section failed or timed out (the report says
which); 2 usage error; 130 interrupted (the report keeps what was measured).

This module only parses options (argparse); torch and the models are imported inside `run`.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_omni_token2wav.benchmarks import bench_cli, common
from vllm_omni_token2wav.cli_types import CLIUsageError

if TYPE_CHECKING:
    from vllm_omni_token2wav.benchmarks.device_check.sections import CheckConfig


def default_out_dir() -> Path:
    out = os.environ.get("OUT")
    return Path(out) if out else Path("out")


class DeviceCheckSubcommand:
    name = "device-check"
    help = "one bounded run on an accelerator: CAM++ parity/latency (eager, graphs, TensorRT), fbank, prompt, Token2Wav"

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        bench_cli.add_device_option(parser)
        parser.add_argument(
            "--smoke", action="store_true", help="tiny sizes, same code paths (CI runs `--device cpu --smoke`)"
        )
        parser.add_argument("--out-dir", metavar="DIR", help="report folder (default: $OUT when set, else ./out)")
        parser.add_argument(
            "--deadline-s",
            type=float,
            metavar="S",
            help="global time limit in seconds (default 420 = 7 min; 240 with --smoke)",
        )
        parser.add_argument(
            "--sections", metavar="A,B", help="comma-separated subset of the sections, run in the default order"
        )
        parser.add_argument("--onnx", metavar="PATH", help="a real campplus.onnx (default: the full-size stand-in)")
        parser.add_argument("--model-dir", metavar="DIR", help="a real token2wav directory (default: the stand-in)")
        parser.add_argument(
            "--threads", type=int, default=1, metavar="N", help="torch host threads (default 1; onnxruntime always 1)"
        )
        parser.add_argument("--seed", type=int, default=0, help="stand-in weights and speech-token seed")

    def run(self, args: argparse.Namespace) -> int:
        from vllm_omni_token2wav.benchmarks.device_check import run as device_check

        config = self.build_config(args)
        sections = device_check.default_sections()
        try:
            device_check.select_sections(config.sections, sections)
        except ValueError as exc:
            raise CLIUsageError(f"--sections: {exc}") from None
        try:
            common.resolve_device(config.device)
        except (ValueError, RuntimeError) as exc:
            raise CLIUsageError(f"--device {config.device}: {exc}") from None
        command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
        try:
            report = device_check.run_device_check(config, sections=sections, command=command)
        except KeyboardInterrupt:
            report = None
        if report is None:
            path = Path(config.out_dir) / device_check.JSON_NAME
            if path.is_file():
                text = device_check.render_text(device_check.load_document(path), sections)
                sys.stdout.write(text)
            print("vllm-omni-token2wav: interrupted; the report holds what was measured", file=sys.stderr)
            return 130
        sys.stdout.write(device_check.finish(report, sections))
        print(f"wrote {report.path} (+ {device_check.TEXT_NAME}, {device_check.PLOT_NAME})", flush=True)
        failed = [n for n, e in report.document["sections"].items() if e["status"] in ("error", "timeout")]
        return 1 if failed else 0

    @staticmethod
    def build_config(args: argparse.Namespace) -> CheckConfig:
        from vllm_omni_token2wav.benchmarks.device_check.sections import CheckConfig

        device = bench_cli.check_device(args.device)
        if args.deadline_s is not None and (not math.isfinite(args.deadline_s) or args.deadline_s <= 0):
            raise CLIUsageError(f"--deadline-s must be a positive number of seconds, got {args.deadline_s}")
        bench_cli.check_at_least("--threads", args.threads, 1)
        onnx = Path(args.onnx).expanduser() if args.onnx else None
        if onnx is not None and not onnx.is_file():
            raise CLIUsageError(f"--onnx {args.onnx}: no such file")
        model_dir = Path(args.model_dir).expanduser() if args.model_dir else None
        if model_dir is not None and not model_dir.is_dir():
            raise CLIUsageError(f"--model-dir {args.model_dir}: no such directory")
        out_dir = Path(args.out_dir).expanduser() if args.out_dir else default_out_dir()
        if out_dir.exists() and not out_dir.is_dir():
            raise CLIUsageError(f"--out-dir {out_dir}: exists and is not a folder")
        sections = tuple(s.strip() for s in (args.sections or "").split(",") if s.strip())
        return CheckConfig(
            device=device,
            smoke=args.smoke,
            out_dir=out_dir,
            deadline_s=args.deadline_s,
            sections=sections,
            onnx=onnx,
            model_dir=model_dir,
            threads=args.threads,
            seed=args.seed,
        )


SUBCOMMAND = DeviceCheckSubcommand()
