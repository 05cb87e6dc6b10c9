# SPDX-License-Identifier: Apache-2.0
"""The benchmarks an operator runs, `vllm-omni-token2wav bench ...`, one home (a subpackage) per subcommand.

Shipped: `spk_embedding`, `token2wav` (with `cosyvoice3/`), `token2wav_serve`, `engine_ab`, `seed_tts`,
`device_check`. Developer measurements (one model part or path) are not installed: they are the
repository's `benchmarks/<name>/`, run as `python -m benchmarks.<name>` from a checkout.

A home holds everything one benchmark is: `run.py` (what it measures), `report.py` (its table, JSON and
PNG), `cli.py` (its `bench` subcommand and, where it has one, its recorder for `benchmarks/record.py`).
The modules directly in this package are the infrastructure several homes share: `common` (host
description, timing, report files), `bench_cli` (the CLI skeleton and the `Recorder`), `progress`,
`engine_server` / `engine_log` (a real served stack), `speech_stream_client`.
"""
