#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Record one `vllm-omni-token2wav bench token2wav-serve` run under `benchmarks/results/`.

Why: the recorded concurrency table (quoted by docs/benchmarks/token2wav_serve.md, README and the
issue's closing note) must come from the same command an operator runs; this script runs exactly
that command and stores its three outputs as
`benchmarks/results/token2wav_serve[_full]_<device>.{txt,json,png}` (`<device>` = cpu, cuda, npu; `_full` with
`--full`; a non-default `--talker-rate T`, `--threads N` or `--clock cpu` adds `_talker<T>`, `_<N>threads`,
`_cpuclock` to the name, so variants never overwrite the default record). `--engine` (the served stack,
`token2wav_serve_engine.py`) records `token2wav_serve_engine_<device>.*`, `_poisson<R>` added for a
`--request-rate R`, `_wallclock` for `--clock wall`.

    .venv/bin/python benchmarks/token2wav_serve.py                 # reduced stand-in, c = 1, 4, 8 on CPU
    .venv/bin/python benchmarks/token2wav_serve.py --full          # full-size stand-in
    .venv/bin/python benchmarks/token2wav_serve.py --device cuda   # c = 1, 8, 32 on an accelerator
    .venv/bin/python benchmarks/token2wav_serve.py --talker-rate 10000 --concurrency 8   # stage-bound, not talker-bound
    .venv/bin/python benchmarks/token2wav_serve.py --engine        # the served stack, c = 1, 4, 8 (~10 min on 2 cores)

Extra options are passed to the command unchanged (`--json` / `--plot` are set here);
`--results-dir DIR` records somewhere else (tests). The exit code is the command's.
"""

from __future__ import annotations

import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def stem_for(argv: list[str]) -> str:
    """`token2wav_serve[_full][_talker<T>][_<N>threads][_cpuclock]`: the default command keeps the plain name.

    `--engine`: `token2wav_serve_engine[_poisson<R>][_wallclock]` (`_wallclock`: in-process steps by the wall clock).
    """
    from vllm_omni_token2wav.benchmarks.common import option_value, thread_clock_suffix

    if "--engine" in argv:
        rate = option_value(argv, "--request-rate")
        wall = "_wallclock" if option_value(argv, "--clock") == "wall" else ""
        return "token2wav_serve_engine" + ("" if rate is None else f"_poisson{float(rate):g}") + wall
    stem = "token2wav_serve_full" if "--full" in argv else "token2wav_serve"
    talker = option_value(argv, "--talker-rate")
    if talker is not None and float(talker) != 100.0:
        stem += f"_talker{float(talker):g}"
    return stem + thread_clock_suffix(argv)


def main(argv: list[str]) -> int:
    from vllm_omni_token2wav.benchmarks.common import record_main

    return record_main(argv, script=Path(__file__).name, bench="token2wav-serve", stem=stem_for(argv), results=RESULTS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
