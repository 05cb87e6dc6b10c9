# SPDX-License-Identifier: Apache-2.0
"""`bench token2wav-stream-memory`: bytes one Token2Wav stream holds vs the floor, fp32 and bf16 caches."""
