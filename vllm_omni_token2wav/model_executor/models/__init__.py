# SPDX-License-Identifier: Apache-2.0
"""The models of the Token2Wav stage, one folder per concern (layers: docs/design/architecture.md).

Front end `audio/`; the CAM++ speaker embedding `speaker_embedding/`; the serving framework `token2wav_stage/`;
the core all families share `token2wav_core/`; the families, siblings that never import each other,
`step_audio2/`, `minicpmo_4_5/`, `cosyvoice3/`; stand-in model folders `standin/`. The networks the families
are built from (flow models, HiFT vocoders, speech tokenizer) are parts: `model_executor/layers/`.
"""
