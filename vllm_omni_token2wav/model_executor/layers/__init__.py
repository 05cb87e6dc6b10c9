# SPDX-License-Identifier: Apache-2.0
"""Model parts every family builds from: flow models, HiFT vocoders, the speech tokenizer.

Like vLLM's `model_executor/layers/` beside `models/`, this home holds the networks, not the families: a part
never imports a family (`model_executor/models/<family>/`), and families pick parts by what their checkpoint
holds. `flow/` is the CosyVoice2 flow (Step-Audio2 and MiniCPM-o 4.5's `flow.pt`) and the sampler pieces every
CosyVoice flow shares; `flow_cosyvoice3/` is CosyVoice3's DiT flow; `hift/` is the HiFT vocoder and the layers
both vocoders share; `hift_causal/` is the causal HiFT (CosyVoice3, MiniCPM-o's causal `hift.pt`);
`speech_tokenizer/` is the S3 speech tokenizer of prompt audio.
"""
