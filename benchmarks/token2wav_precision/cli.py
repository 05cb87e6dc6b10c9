# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.token2wav_precision`: how far a reduced-precision flow moves mel and audio from fp32.

Runs `benchmarks.token2wav_precision.run` on the reduced stand-ins (the facades of MiniCPM-o 4.5,
Step-Audio2 and CosyVoice3; `--device`, default the serving device) and prints, per family and flow
dtype (float16, bfloat16), the max abs and relative L2 deviation from the same request with the fp32
flow: the mel the flow hands the vocoder and the audio, per streamed chunk (the worst chunk) and for the
whole utterance; plus the fp32 mel vocoded with the vocoder under autocast (why the vocoder stays fp32).
Writes `out/token2wav_precision.json` and `.txt` unless `--json` says elsewhere (the recorded
`benchmarks/results/token2wav_precision_cpu.*` came from `python benchmarks/record.py token2wav_precision`).

    python -m benchmarks.token2wav_precision                            # 3 families, fp16 and bf16
    python -m benchmarks.token2wav_precision --families cosyvoice3 --tokens 60

This module only parses options; torch and the models are imported inside `run`.
"""

from __future__ import annotations

import argparse
from functools import partial

from benchmarks import program, run_home
from vllm_omni_token2wav.benchmarks import bench_cli

FAMILIES = ("minicpmo_4_5", "step_audio2", "cosyvoice3")
DTYPES = ("float16", "bfloat16")


class Token2wavPrecisionSubcommand:
    name = "token2wav-precision"
    help = "mel and audio deviation of an fp16 / bf16 flow from the fp32 flow, per chunk and whole, per family"

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--tokens", type=int, default=100, help="speech tokens per request (25 per second)")
        parser.add_argument("--requests", type=int, default=2, help="requests per family (different tokens, seeds)")
        parser.add_argument("--families", default=",".join(FAMILIES), help="comma list of families")
        parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma list: float16, bfloat16")
        parser.add_argument("--n-timesteps", type=int, default=10)
        parser.add_argument("--threads", type=int, default=1)
        bench_cli.add_device_option(parser)
        bench_cli.add_json_option(parser, bench_cli.DEFAULT_REPORT_DIR / "token2wav_precision.json")
        bench_cli.add_unused_plot_option(parser)  # the report is its table

    def run(self, args: argparse.Namespace) -> int:
        from benchmarks.token2wav_precision.run import execute

        return execute(args)


SUBCOMMAND = Token2wavPrecisionSubcommand()

RECORDERS = (
    bench_cli.Recorder(
        program=program("token2wav_precision"),
        entry=partial(run_home, "token2wav_precision"),
        name="token2wav_precision",
        command=(),
        stem=bench_cli.fixed_stem("token2wav_precision"),
        summary="token2wav_precision_<device>: fp16 / bf16 flow vs fp32: mel and audio, chunk and whole, per family",
    ),
)
