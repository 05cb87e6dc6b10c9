# SPDX-License-Identifier: Apache-2.0
"""`bench prompt-path`: end-to-end cost of `prepare_prompt` (the Token2Wav request path of a reference voice)."""
