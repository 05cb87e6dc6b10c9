# SPDX-License-Identifier: Apache-2.0
"""The Token2Wav stage as vLLM-Omni drives it: request-routed, cross-request batched, streaming.

Layers (docs/design/token2wav_stage.md): `contract` (the engine's calling convention), `state` and
`store` (per-request stream state), `planner` (launch groups as data), `engine` (one step),
`backend` (the per-family kernel Protocol; `cosyvoice2_backend` for MiniCPM-o 4.5 / Step-Audio2),
`families`, `voice`, `options`, and `stage_model` (the `nn.Module` the runner builds).
"""
