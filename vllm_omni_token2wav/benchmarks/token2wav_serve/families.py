# SPDX-License-Identifier: Apache-2.0
"""The families `bench token2wav-serve` serves, from the one family list, and the names it took before it.

Kept apart from `run.py` (torch, the emulated producer) so the command line builds its `--family` choices
from a light import: the family list holds records and strings only (`token2wav_stage/families.py`).
"""

from __future__ import annotations

from typing import Final

from vllm_omni_token2wav.model_executor.models.token2wav_stage import families as family_registry

#: The families on the shared core's CosyVoice2 flow: the emulated producer and the stage class of each come
#: from its registry record (`producer`, `serving.stage_class`). The first is the default.
FAMILIES: Final = tuple(f.name for f in family_registry.registered_families() if f.spec.cosyvoice2_flow is not None)
#: The spellings of `--family` before the family list: still accepted (recorded commands run unchanged).
FAMILY_ALIASES: Final = {"minicpmo": "minicpmo_4_5", "step-audio2": "step_audio2"}


def canonical_family(name: str) -> str:
    """`name` in the family list's spelling (an old alias mapped); unknown names are returned unchanged."""
    return FAMILY_ALIASES.get(name, name)


__all__ = ["FAMILIES", "FAMILY_ALIASES", "canonical_family"]
