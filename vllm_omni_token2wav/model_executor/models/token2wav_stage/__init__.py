# SPDX-License-Identifier: Apache-2.0
"""The Token2Wav stage as vLLM-Omni drives it: request-routed, cross-request batched, streaming.

Layers (docs/design/token2wav_stage.md): `contract` (the engine's calling convention), `state` and
`store` (per-request stream state), `planner` (launch groups as data), `engine` (one step),
`backend` (the per-family kernel Protocol, generic in a family's voice / caches / flow product),
`families` (`FamilySpec` and the one registry of families), `voice` and `fields` (what a segment
asks for), `options`, and `stage_model` (the `nn.Module` the runner builds). It knows no family: each
family's spec, backend and stage class live in the family's folder (the shared flow + HiFT backend in
`token2wav_core/`).
"""
