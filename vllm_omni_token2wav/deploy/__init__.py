# SPDX-License-Identifier: Apache-2.0
"""Deploy YAMLs shipped with the plugin (vLLM-Omni's `--deploy-config` / `Omni(deploy_config=...)`).

| file                              | pipeline (plugins/pipelines.py)   | what it runs                                |
|-----------------------------------|-----------------------------------|---------------------------------------------|
| `<family>_code2wav.yaml`          | `<family>_code2wav`               | the family's code2wav stage alone: requests |
|                                   |                                   | are codec ids + an optional voice           |
| `standin_<family>_stream.yaml`    | `standin_<family>_stream`         | stand-in producer -> code2wav through the    |
|                                   |                                   | async-chunk transfer (tests, benchmarks)     |

Families: `minicpmo_4_5`, `step_audio2`, `cosyvoice3` (the stand-in stream: `step_audio2` and
`cosyvoice3`, whose producers' codes travel as token ids). Each file is declared by its family's
`family.py` (`PipelineFacts.deploy_yamls`; tests/plugins/test_family_registry.py checks every file here
belongs to one family and names one of its pipelines). Each file has a `platforms.cpu` section for
CPU-only hosts (explicit KV cache sizes).
"""

from __future__ import annotations

from pathlib import Path

DEPLOY_DIR = Path(__file__).resolve().parent


def deploy_config(name: str) -> Path:
    """The shipped deploy YAML `name` (with or without `.yaml`); FileNotFoundError lists the choices."""
    path = DEPLOY_DIR / (name if name.endswith(".yaml") else f"{name}.yaml")
    if not path.is_file():
        choices = ", ".join(sorted(p.stem for p in DEPLOY_DIR.glob("*.yaml")))
        raise FileNotFoundError(f"no deploy config {name!r} in {DEPLOY_DIR}; shipped: {choices}")
    return path


__all__ = ["DEPLOY_DIR", "deploy_config"]
