# SPDX-License-Identifier: Apache-2.0
"""The models of the Token2Wav stage, one folder per concern (layers: docs/design/architecture.md).

Front end `audio/`; model parts `speaker_embedding/` (CAM++), `cosyvoice2/` (flow, HiFT, speech
tokenizer), `cosyvoice3/flow/` and `cosyvoice3/hift/`; the serving framework `token2wav_stage/`; the
core all families share `token2wav_core/`; the families `step_audio2/`, `minicpmo_4_5/`, `cosyvoice3/`.
"""
