# SPDX-License-Identifier: Apache-2.0
"""Toy pipeline runs only: Python imports this `sitecustomize` at start-up when this folder is on `PYTHONPATH`.

The toy pipelines' tests and scripts put this folder on the `PYTHONPATH` of the engine processes they spawn
(`standin.toy.site_pythonpath`), so both toy doors open there: the chunk recorder of upstream's Step-Audio2 /
MiniCPM-o async-chunk functions (`../recorder.py`, only with `VLLM_OMNI_TOKEN2WAV_TOY_CHUNKS` set) and the
CosyVoice3 door (`../cosyvoice3_door.py`: the stand-in speech tokenizer v3 and, with
`VLLM_OMNI_TOKEN2WAV_TOY_RECORD` set, the recorder of upstream's CosyVoice3 producer). Each acts only on the
upstream module it names. A user's deployment never has this folder on its path.
"""

from vllm_omni_token2wav.model_executor.models.standin.toy import cosyvoice3_door, recorder

recorder.install()
cosyvoice3_door.install()
