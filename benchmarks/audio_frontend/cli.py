# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.audio_frontend`: what does the torch fbank cost on this device, and how close is it?

Runs `benchmarks.audio_frontend.run` (the in-tree torch fbank against kaldi-native-fbank
on the CPU, interleaved; the agreement the design doc quotes) and prints a table; writes
`out/audio_frontend.json` unless `--json` says elsewhere (the recorded `benchmarks/results/audio_frontend.json`
came from `--json` there). kaldi-native-fbank comes with the dev extra.

    python -m benchmarks.audio_frontend --repeats 20
    python -m benchmarks.audio_frontend --device cpu --durations 2 10 --batches 1

This module only parses options; torch and the models are imported inside `run`.
"""

from __future__ import annotations

import argparse

from vllm_omni_token2wav.benchmarks import bench_cli


class AudioFrontendSubcommand:
    name = "audio-frontend"
    help = "torch audio front end (Kaldi fbank, 24 kHz mel) vs kaldi-native-fbank: speed and agreement"

    def add_cli_args(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--device", default=None, help="torch device (default: the platform device)")
        parser.add_argument("--durations", type=float, nargs="+", default=[2.0, 10.0, 30.0])
        parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
        parser.add_argument("--repeats", type=int, default=20, help="timed runs per implementation and case (>= 20)")
        parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (upstream ORT uses 1)")
        bench_cli.add_json_option(parser, bench_cli.DEFAULT_REPORT_DIR / "audio_frontend.json", deprecated=("--out",))

    def run(self, args: argparse.Namespace) -> int:
        from benchmarks.audio_frontend.run import execute

        return execute(args)


SUBCOMMAND = AudioFrontendSubcommand()
