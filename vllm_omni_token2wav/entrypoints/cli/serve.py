# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni-token2wav serve ...`: vLLM-Omni's `vllm-omni serve`, with this fork's plugins loaded first.

Every argument is passed to upstream's command unchanged (`--omni` is added when missing: our stages
only run in vLLM-Omni's engine), except that `--deploy-config NAME` naming one of this package's
shipped YAMLs (`vllm_omni_token2wav/deploy/`, e.g. `step_audio2_code2wav.yaml`) and no file in the
current folder becomes that YAML's path. The one thing this wrapper does first is load vLLM-Omni's general
plugins in this process: upstream's `serve` resolves the deploy YAML's pipeline before it loads
plugins, so a pipeline this plugin registers (`pipeline: step_audio2_code2wav`) would otherwise be
"not registered to OMNI_PIPELINES". Upstream's own pipelines (MiniCPM-o 4.5, Step-Audio2,
CosyVoice3) work with plain `vllm-omni serve` too once this package is installed.

Example (a Step-Audio2 code2wav stage alone, codec ids in, 24 kHz audio out; the shipped YAMLs are
in `vllm_omni_token2wav/deploy/`, `deploy_config(name)` gives a path):

    vllm-omni-token2wav serve /path/to/Step-Audio-2-mini --deploy-config .../deploy/step_audio2_code2wav.yaml
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

NAME = "serve"
HELP = "serve through vLLM-Omni (`vllm-omni serve ... --omni`, every argument passed through)"


def serve(argv: Sequence[str], prog: str) -> int:
    """Run upstream's `vllm-omni serve <argv> --omni` after loading the plugins; returns the exit code."""
    try:
        from vllm_omni.entrypoints.cli.main import main as omni_main
    except ImportError as exc:
        print(
            f"{prog}: error: serving needs vLLM-Omni 0.30 and vLLM ({exc}); install them first "
            "(CPU hosts: bash tools/install_engine_cpu.sh; GPU/NPU: see README, 'Serving')",
            file=sys.stderr,
        )
        return 2
    from vllm_omni_token2wav.plugins import load_plugins

    load_plugins()
    args = _resolve_shipped_deploy_config(list(argv))
    _unpin_split_stage_on_cpu(args)
    if "--omni" not in args:
        args.append("--omni")
    saved = sys.argv
    sys.argv = ["vllm-omni", NAME, *args]  # upstream's CLI parses sys.argv
    try:
        omni_main()
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
    return 0


#: vLLM's CPU worker binding: `auto` pins each engine process's worker to the same cores.
OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def split_cpu_binding(args: Sequence[str], environ: dict[str, str] | os._Environ[str], accelerator: bool) -> str | None:
    """The `VLLM_CPU_OMP_THREADS_BIND` a split-deployment process on a CPU host needs (`nobind`), else None.

    In a split deployment (`--stage-id N`, head or `--headless`) every process places its own stage workers, and
    vLLM's CPU worker with `VLLM_CPU_OMP_THREADS_BIND=auto` (its default) pins each one to the same cores (on a
    2-core host: core 0, core 1 reserved). The idle code2wav worker spins on its shared-memory queue
    (`shm_broadcast.py` `SpinCondition.wait`: `sched_yield` while its engine core keeps stepping a request that
    waits for chunks) on that core, and the producer's worker pinned there got no CPU: the first requests waited
    until vLLM's RPC timeout (measured 2026-12-06, docs/design/multinode.md). Unpinned, the kernel spreads them.
    A value the user set is kept; accelerator hosts are left alone.
    """
    if accelerator or OMP_BIND_ENV in environ:
        return None
    if not any(a == "--stage-id" or a.startswith("--stage-id=") for a in args):
        return None
    return "nobind"


def _unpin_split_stage_on_cpu(args: Sequence[str]) -> None:
    import torch

    accelerator = getattr(torch, "accelerator", None)
    value = split_cpu_binding(args, os.environ, bool(accelerator is not None and accelerator.is_available()))
    if value is not None:
        os.environ[OMP_BIND_ENV] = value  # the engine processes this one starts inherit it
        print(
            f"vllm-omni-token2wav serve: split deployment on a CPU host: {OMP_BIND_ENV}={value} (vLLM's `auto` pins "
            "every stage process's worker to the same core; set the variable to choose cores yourself)",
            file=sys.stderr,
        )


def _resolve_shipped_deploy_config(args: list[str]) -> list[str]:
    """`--deploy-config NAME` -> the shipped YAML's path when NAME is not a file here but one of ours."""
    from pathlib import Path

    from vllm_omni_token2wav.deploy import DEPLOY_DIR

    out = list(args)
    for i, arg in enumerate(out):
        value, prefix = None, ""
        if arg == "--deploy-config" and i + 1 < len(out):
            value, index = out[i + 1], i + 1
        elif arg.startswith("--deploy-config="):
            value, index, prefix = arg.split("=", 1)[1], i, "--deploy-config="
        if value is None or Path(value).exists() or Path(value).name != value:
            continue
        shipped = DEPLOY_DIR / (value if value.endswith(".yaml") else f"{value}.yaml")
        if shipped.is_file():
            out[index] = prefix + str(shipped)
    return out


__all__ = ["HELP", "NAME", "OMP_BIND_ENV", "serve", "split_cpu_binding"]
