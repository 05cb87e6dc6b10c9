# SPDX-License-Identifier: Apache-2.0
"""Toy CosyVoice3 runs only: Python imports this `sitecustomize` at start-up when this folder is on `PYTHONPATH`.

The toy pipeline's tests and scripts put this folder on the `PYTHONPATH` of the engine processes they spawn
(`cosyvoice3_door.site_pythonpath`), so upstream's CosyVoice3 talker there gets the stand-in speech
tokenizer v3 instead of downloading the real one (and, with `VLLM_OMNI_TOKEN2WAV_TOY_RECORD` set, records
its producer functions' results). `../cosyvoice3_door.py` says what the door does and why; a user's
deployment never has this folder on its path.
"""

from vllm_omni_token2wav.model_executor.models.standin.toy.cosyvoice3_door import install

install()
