# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.token2wav_stream_memory`: bytes one stream holds vs the floor, fp32 and bf16 caches."""
