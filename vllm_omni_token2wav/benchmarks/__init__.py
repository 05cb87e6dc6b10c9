# SPDX-License-Identifier: Apache-2.0
"""The benchmarks behind `vllm-omni-token2wav bench ...`, one home (a subpackage) per benchmark.

A home holds everything one benchmark is: `run.py` (what it measures), `report.py` (its table, JSON and
PNG), `cli.py` (its `bench` subcommand and, where it has one, its recorder for `benchmarks/record.py`).
The modules directly in this package are the infrastructure several homes share: `common` (host
description, timing, report files), `bench_cli` (the CLI skeleton and the `Recorder`), `progress`,
`engine_server` / `engine_log` (a real served stack), `speech_stream_client`.
"""
