# SPDX-License-Identifier: Apache-2.0
"""Model code of the Token2Wav stage (device-agnostic: platform checks go through `vllm_omni_token2wav.platforms`)."""
