# SPDX-License-Identifier: Apache-2.0
"""The Token2Wav facades' shared code: one facade base for every family, and the CosyVoice2-flow + HiFT core.

Every family (Step-Audio2, MiniCPM-o 4.5, CosyVoice3) uses `facade.Token2WavFacade`, the base of its
facade, with the components it owns by composition: `speaker_prompt.SpeakerPrompt` (speaker-embedding
backend lifecycle and prompt-feature cache), `assets` (file names, asset paths, lazy device),
`prompt_features` / `prompt_cache` (the `PromptFeatures` dataclass, content LRU), and the stream
guard of `stream` (`StepGuard`, `StreamInUseError`, PCM conversion).

Step-Audio2 and MiniCPM-o alone use the rest, the CosyVoice2 flow + HiFT core: `core.Token2WavCore`
(models, synthesis and streaming API), `synthesis` / `stream` (whole-utterance and per-chunk
computation, stream state), `stream_vocoder` / `causal_vocoder` (which vocoder streams the flow's mel),
`stage_backend` (the serving stage's backend over the core: CosyVoice2 flow + HiFT rows of many
requests), `graphs` (its device graphs) and `stage.CoreStageModel` (their stage class). CosyVoice3's
core, backend and synthesis are its own (`cosyvoice3/`).
Nothing is imported here (importing the package loads no model code).
"""
