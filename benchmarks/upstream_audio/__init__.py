# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.upstream_audio`: ours vs vLLM-Omni 0.30's Token2Wav classes, same tokens, voice and noise."""
