# SPDX-License-Identifier: Apache-2.0
"""The Token2Wav core shared by Step-Audio2, MiniCPM-o 4.5 and CosyVoice3.

`core.Token2WavCore` (the lazy facade of Step-Audio2 and MiniCPM-o: models, synthesis and streaming
API), the components every core owns by composition (`speaker_prompt.SpeakerPrompt`: speaker-embedding
backend lifecycle and prompt-feature cache; `assets`: file names, asset paths, lazy device; CosyVoice3's
facade owns them too), `prompt_features` / `prompt_cache` (the `PromptFeatures` dataclass, content LRU),
`synthesis` / `stream` (whole-utterance and per-chunk computation, stream state), `stream_vocoder` /
`causal_vocoder` (which vocoder streams the flow's mel), `stage_backend` (the serving stage's backend
over the core: CosyVoice2 flow + HiFT rows of many requests) and `graphs` (its device graphs).
Nothing is imported here (importing the package loads no model code).
"""
