# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.token2wav_memory_budget`: stream bytes per audio second; long replies under a budget."""
