# SPDX-License-Identifier: Apache-2.0
"""Lay out a family's toy upstream pipeline and print how to serve it (what the README shows).

`python -m vllm_omni_token2wav.model_executor.models.standin.toy step_audio2 [--sync] [--out DIR]` builds
the toy model folder (cached), writes the overlay over upstream's own deploy YAML into DIR and prints
the `vllm-omni-token2wav serve` command line (with the environment CosyVoice3's toy talker needs).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path

from vllm_omni_token2wav.model_executor.models.standin.toy import TOY_PIPELINES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_omni_token2wav.model_executor.models.standin.toy")
    parser.add_argument("family", choices=sorted(TOY_PIPELINES))
    parser.add_argument("--sync", action="store_true", help="upstream's sync deployment (default: async-chunk)")
    parser.add_argument("--out", type=Path, help="folder for the overlay YAML (default: a new temporary folder)")
    args = parser.parse_args(argv)
    pipeline = TOY_PIPELINES[args.family]
    out = args.out or Path(tempfile.mkdtemp(prefix=f"toy_{args.family}_"))
    model_dir = pipeline.ensure_model_dir()
    deploy = pipeline.deployment(model_dir, out, async_chunk=not args.sync)
    env = ""
    engine_env = getattr(pipeline, "engine_env", None)
    if engine_env is not None:  # CosyVoice3: the toy talker's speech tokenizer door on PYTHONPATH
        env = f"PYTHONPATH={shlex.quote(engine_env(base={})['PYTHONPATH'])} "
    print(f"model folder: {model_dir}")
    print(f"deploy YAML:  {deploy}")
    print(f"{env}vllm-omni-token2wav serve {shlex.quote(str(model_dir))} --deploy-config {shlex.quote(str(deploy))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
