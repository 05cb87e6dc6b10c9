#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Record one `vllm-omni bench token2wav` run under `benchmarks/results/`.

Why: the recorded Token2Wav RTF table (quoted by docs/benchmarks/token2wav.md and the issue's closing
note) must come from the same command an operator runs; this script runs exactly that command and
stores its three outputs as `benchmarks/results/token2wav_rtf_<device>.{txt,json,png}` (`<device>` =
cpu, cuda, npu).

    .venv/bin/python benchmarks/token2wav_rtf.py                     # full-size stand-in, device defaults
    .venv/bin/python benchmarks/token2wav_rtf.py --model-dir /path/to/token2wav --threads 1

Extra options are passed to the command unchanged (`--json` / `--plot` are set here);
`--results-dir DIR` records somewhere else (tests). The exit code is the command's.
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


class _Tee(io.TextIOBase):
    """Write to the terminal and keep a copy (the .txt record of the table)."""

    def __init__(self, stream: io.TextIOBase) -> None:
        self._stream = stream
        self.copy = io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()


def _device_type(argv: list[str]) -> str:
    from vllm_omni import platforms

    device = platforms.current_omni_platform.device_type
    for i, arg in enumerate(argv):
        if arg == "--device" and i + 1 < len(argv) and argv[i + 1] != "auto":
            device = argv[i + 1].split(":")[0]
        elif arg.startswith("--device=") and arg.split("=", 1)[1] != "auto":
            device = arg.split("=", 1)[1].split(":")[0]
    return device


def main(argv: list[str]) -> int:
    from vllm_omni.atomic_io import write_bytes_atomic
    from vllm_omni.entrypoints.cli.main import main as cli_main

    results = RESULTS
    if "--results-dir" in argv:
        i = argv.index("--results-dir")
        if i + 1 >= len(argv):
            print("token2wav_rtf.py: --results-dir needs a folder", file=sys.stderr)
            return 2
        results = Path(argv[i + 1])
        argv = argv[:i] + argv[i + 2 :]
    stem = results / f"token2wav_rtf_{_device_type(argv)}"
    args = ["bench", "token2wav", *argv, "--json", f"{stem}.json", "--plot", f"{stem}.png"]
    tee = _Tee(sys.stdout)  # type: ignore[arg-type]
    with contextlib.redirect_stdout(tee):
        code = cli_main(args)
    if code == 0:
        write_bytes_atomic(Path(f"{stem}.txt"), tee.copy.getvalue().encode())
        print(f"recorded {stem}.txt")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
