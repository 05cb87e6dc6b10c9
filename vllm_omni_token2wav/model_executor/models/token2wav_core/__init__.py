# SPDX-License-Identifier: Apache-2.0
"""The Token2Wav core shared by Step-Audio2, MiniCPM-o 4.5 and CosyVoice3.

`core.Token2WavCore` (the lazy facade: assets, speaker backend, models, prompt path, synthesis and
streaming API), `prompt_features` / `prompt_cache` (the `PromptFeatures` dataclass, content LRU),
`synthesis` / `stream` (whole-utterance and per-chunk computation, stream state), `stream_vocoder` /
`causal_vocoder` (which vocoder streams the flow's mel), `stage_backend` (the serving stage's backend
over the core: CosyVoice2 flow + HiFT rows of many requests) and `graphs` (its device graphs).
Nothing is imported here (importing the package loads no model code).
"""
