# SPDX-License-Identifier: Apache-2.0
"""Toy pipeline tests only: Python imports this `sitecustomize` at start-up when this folder is on `PYTHONPATH`.

The toy pipeline tests put this folder on the `PYTHONPATH` of the engine processes they spawn
(`recorder.site_pythonpath`), so upstream's async-chunk functions there record what they hand the code2wav
stage (`../recorder.py`; only with `VLLM_OMNI_TOKEN2WAV_TOY_CHUNKS` set). A user's deployment never has this
folder on its path.
"""

from vllm_omni_token2wav.model_executor.models.standin.toy.recorder import install

install()
