# SPDX-License-Identifier: Apache-2.0
"""The families `bench engine-ab` compares, from the one family list, without the benchmark's heavy imports.

Kept apart from `run.py` (numpy, torch through the emulated producer) so the command line builds its
`--families` choices from a light import: the family list holds records and strings only
(`token2wav_stage/families.py`).
"""

from __future__ import annotations

from typing import Final

from vllm_omni_token2wav.model_executor.models.token2wav_stage import families as family_registry

#: The families with an upstream deployment to compare with (`upstream_deploy` in their `family.py`).
FAMILIES: Final = tuple(
    f.name for f in family_registry.registered_families() if f.pipelines.upstream_deploy is not None
)
#: Families with a stand-in stream deployment (`standin_stream`): MiniCPM-o's upstream async-chunk function reads
#: its talker's per-step multimodal output, which the stand-in producer does not emit.
STREAM_FAMILIES: Final = tuple(f for f in FAMILIES if family_registry.family(f).pipelines.standin_stream)
#: family -> (vLLM-Omni's deploy YAML for the model, the code2wav stage's id in it): where upstream's arm
#: takes its code2wav `max_num_seqs` from (each family's `upstream_deploy`).
UPSTREAM_DEPLOYS: Final[dict[str, tuple[str, int]]] = {
    f: deploy for f in FAMILIES if (deploy := family_registry.family(f).pipelines.upstream_deploy) is not None
}

__all__ = ["FAMILIES", "STREAM_FAMILIES", "UPSTREAM_DEPLOYS"]
