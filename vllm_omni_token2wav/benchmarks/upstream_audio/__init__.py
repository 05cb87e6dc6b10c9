# SPDX-License-Identifier: Apache-2.0
"""`bench upstream-audio`: ours vs vLLM-Omni 0.30's own Token2Wav classes, same tokens, voice and noise."""
