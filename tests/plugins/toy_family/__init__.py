# SPDX-License-Identifier: Apache-2.0
"""A fourth, toy Token2Wav family (tests only): the proof that a family is its folder and one list line.

`family.py` declares every fact (`FAMILY`), `toy_token2wav.py` is its stage class over the shared core. The
shipped list (`token2wav_stage/families.py:FAMILY_MODULES`) does not name it: the tests add its one line
through `VLLM_OMNI_TOKEN2WAV_EXTRA_FAMILIES` (read in every process, engine workers included) or by extending
the list in-process. It lives under tests/ so users never see a toy in the overrides, pipelines or CLI.
"""
